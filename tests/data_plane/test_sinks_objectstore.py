"""Results written to an object store (moto's S3 server on loopback), from real jobs: whole
files only, the same bytes as a local export, idempotent, and a failed write leaves the
previous object as it was with no temporary key behind."""

from __future__ import annotations

import fsspec
import pytest
import yaml
from s3fs.core import S3File, S3FileSystem

from lowtide.core.errors import LowtideError
from lowtide.engine.export import export_results
from lowtide.store.db import Store
from tests.cli.test_cli import Cli, write_job
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv


def _rows(n: int) -> list[dict]:
    return [{**r, "n": str(i)} for i, r in enumerate(ticket_rows(n))]


@pytest.fixture
def job(tmp_path, clock):
    """A finished 12-row job over tickets.csv (n: a declared int column)."""
    write_csv(tmp_path / "tickets.csv", _rows(12))
    spec = make_spec(tmp_path / "tickets.csv", source={"types": {"n": "int"}})
    store = Store(str(tmp_path / "lowtide.db"))
    drive_to_end(store, spec, clock)
    yield store
    store.close()


def _keys(s3, bucket: str) -> list[str]:
    fs = s3.fs()
    fs.invalidate_cache()
    return sorted(fs.find(bucket))


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_results_to_s3_are_the_local_exports_bytes_and_a_second_export_changes_nothing(s3, job, tmp_path, fmt):
    url = s3.bucket("results")
    local = export_results(job, "tickets", tmp_path / f"local.{fmt}")
    report = export_results(job, "tickets", f"{url}/daily/results.{fmt}")
    assert (report.path, report.rows, report.states) == (f"{url}/daily/results.{fmt}", 12, {"succeeded": 12})
    first = s3.fs().cat(f"results/daily/results.{fmt}")
    assert first == (tmp_path / f"local.{fmt}").read_bytes() and local.rows == 12
    again = export_results(job, "tickets", f"{url}/daily/results.{fmt}")
    assert again.rows == 12 and s3.fs().cat(f"results/daily/results.{fmt}") == first
    assert _keys(s3, "results") == [f"results/daily/results.{fmt}"]  # no temporary key left


def test_a_source_row_that_fails_mid_export_leaves_the_previous_object_and_no_temporary_key(s3, job, tmp_path):
    url = s3.bucket("failing")
    export_results(job, "tickets", f"{url}/results.jsonl")
    before = s3.fs().cat("failing/results.jsonl")
    rows = _rows(12)
    rows[-1]["n"] = "many"  # not an int: the source is refused after the other rows were written
    write_csv(tmp_path / "tickets.csv", rows)
    with pytest.raises(LowtideError, match="many"):
        export_results(job, "tickets", f"{url}/results.jsonl")
    assert s3.fs().cat("failing/results.jsonl") == before
    assert _keys(s3, "failing") == ["failing/results.jsonl"]


class _ResetAfterUpload(S3File):
    """A connection that drops after the store took the whole object: the client sees an error."""

    def _upload_chunk(self, final=False):
        done = super()._upload_chunk(final)
        if final:
            raise ConnectionResetError(104, "Connection reset by peer")
        return done


class _FlakyS3(S3FileSystem):
    protocol = ("flakys3",)

    def _open(self, path, mode="rb", **kwargs):
        f = super()._open(path, mode, **kwargs)
        if "w" in mode:
            f.__class__ = _ResetAfterUpload
        return f


def test_a_store_failing_the_write_leaves_the_previous_object_and_removes_the_temporary_one(s3, job):
    fsspec.register_implementation("flakys3", _FlakyS3, clobber=True)
    url = s3.bucket("flaky")
    export_results(job, "tickets", f"{url}/results.parquet")
    before = s3.fs().cat("flaky/results.parquet")
    with pytest.raises(LowtideError) as caught:
        export_results(job, "tickets", "flakys3://flaky/results.parquet")
    assert str(caught.value) == "flakys3://flaky/results.parquet: cannot write (Connection reset by peer)"
    assert s3.fs().cat("flaky/results.parquet") == before
    assert _keys(s3, "flaky") == ["flaky/results.parquet"]  # the temporary object it did write is gone


def test_lowtide_run_writes_a_specs_s3_output_and_results_out_writes_another(s3, tmp_path):
    url = s3.bucket("cli")
    write_job(tmp_path, output={"path": f"{url}/run/results.csv"})
    cli = Cli(tmp_path, str(tmp_path / "lowtide.db"))
    code, out = cli("run", "job.yaml")
    assert code == 0, out
    assert f"results: {url}/run/results.csv (6 rows)" in out
    text = s3.fs().cat("cli/run/results.csv").decode()
    assert text.splitlines()[0].startswith("ticket_id,channel,body,gold,custom_id,state,output") and len(text.splitlines()) == 7
    code, out = cli("results", "tickets", "--out", f"{url}/copy/results.parquet")
    assert code == 0, out
    import pyarrow.parquet as pq

    table = pq.read_table(s3.fs().open("cli/copy/results.parquet", "rb"))
    assert table.num_rows == 6 and set(table.column("state").to_pylist()) == {"succeeded"}
    assert _keys(s3, "cli") == ["cli/copy/results.parquet", "cli/run/results.csv"]


def test_lowtide_run_refuses_an_unknown_bucket_before_anything_is_stored(s3, tmp_path):
    write_job(tmp_path, output={"path": "s3://no-such-bucket-here/results.csv"})
    cli = Cli(tmp_path, str(tmp_path / "lowtide.db"))
    code, out = cli("run", "job.yaml")
    assert code == 2, out
    assert "output.path s3://no-such-bucket-here/results.csv: no such bucket; check the bucket's name in the URL" in out
    assert not (tmp_path / "lowtide.db").exists()


def test_a_spec_may_name_an_object_store_but_a_local_path_only_inside_its_folder(tmp_path):
    from lowtide.core.errors import SpecError
    from lowtide.core.output_target import output_target
    from lowtide.core.spec import load_spec

    spec_path = write_job(tmp_path, output={"path": "s3://bucket/results.csv"})
    assert output_target(load_spec(spec_path)).path == "s3://bucket/results.csv"
    data = yaml.safe_load(spec_path.read_text())
    data["output"] = {"path": "../results.csv"}
    spec_path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="a spec writes only inside its own folder"):
        output_target(load_spec(spec_path))
