"""`output.partition_by`: results as a Hive-partitioned dataset, local and on S3 (moto), from
real jobs; read back by pyarrow and by lowtide's own folder source; stale partitions go,
and exporting again writes the same files with the same bytes."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pytest

from lowtide.core.errors import SpecError
from lowtide.core.output_target import OutputTarget
from lowtide.core.sources import SourceSpec, source_at
from lowtide.engine.export import write_target
from lowtide.engine.preflight import check_target
from lowtide.store.db import Store
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv


def _rows() -> list[dict]:
    return [{**r, "channel": ("email", "chat", "phone / fax")[i % 3]} for i, r in enumerate(ticket_rows(9))]


@pytest.fixture
def job(tmp_path, clock):
    """A finished 9-row job in which T1003 failed (its first 3 attempts fail; 3 are allowed)."""
    write_csv(tmp_path / "tickets.csv", _rows())
    spec = make_spec(tmp_path / "tickets.csv", route_options={"fail_attempts": {"T1003": 3}})
    store = Store(str(tmp_path / "lowtide.db"))
    status = drive_to_end(store, spec, clock)
    assert status.counts["failed"] == 1
    yield store, spec
    store.close()


def _drop_failed_row(folder: Path) -> None:
    write_csv(folder / "tickets.csv", [r for r in _rows() if r["ticket_id"] != "T1003"])


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_local_partitions_by_a_result_column_read_back_and_a_stale_partition_goes(job, tmp_path, fmt):
    store, spec = job
    out = tmp_path / "out"
    target = OutputTarget("output.path", str(out), fmt, ("state",))
    report = write_target(store, "tickets", target)
    ext = {"csv": ".csv", "jsonl": ".jsonl", "parquet": ".parquet"}[fmt]
    assert report.files == [f"state=succeeded/part-0{ext}", f"state=failed/part-0{ext}"] or report.files == [
        f"state=failed/part-0{ext}", f"state=succeeded/part-0{ext}"]  # fmt: skip
    assert sorted(_files(out)) == sorted(report.files)  # nothing else: no staging left behind
    rows = [r.values for chunk in source_at(SourceSpec(path=str(out), id_column="ticket_id", format=fmt)).chunks() for r in chunk]
    assert sorted((r["ticket_id"], r["state"]) for r in rows) == sorted(
        (f"T{1000 + i}", "failed" if i == 3 else "succeeded") for i in range(9))  # fmt: skip
    # The failed row leaves the source: the next export has no `failed` partition any more.
    _drop_failed_row(tmp_path)
    again = write_target(store, "tickets", target)
    assert again.files == [f"state=succeeded/part-0{ext}"] and sorted(_files(out)) == again.files
    assert not (out / "state=failed").exists()
    first = _files(out)
    write_target(store, "tickets", target)
    assert _files(out) == first  # idempotent: same files, same bytes


def test_partitions_by_a_source_column_with_an_awkward_value_and_two_levels(job, tmp_path):
    store, _ = job
    out = tmp_path / "by-channel"
    (out / "channel=fax").mkdir(parents=True)
    (out / "channel=fax" / "part-0.parquet").write_bytes(b"an earlier export's, by channel alone")
    (out / "notes.txt").write_text("not ours")  # not a part file: left alone
    report = write_target(store, "tickets", OutputTarget("output.path", str(out), None, ("channel", "state")))
    assert report.rows == 9
    assert sorted(report.files) == [
        "channel=chat/state=succeeded/part-0.parquet", "channel=email/state=failed/part-0.parquet",
        "channel=email/state=succeeded/part-0.parquet", "channel=phone%20%2F%20fax/state=succeeded/part-0.parquet",
    ]  # fmt: skip
    assert sorted(_files(out)) == sorted([*report.files, "notes.txt"])  # the one-level partition of before is gone
    assert not (out / "channel=fax").exists()
    table = ds.dataset(str(out), format="parquet", partitioning="hive", exclude_invalid_files=True).to_table()
    got = sorted(zip(table.column("ticket_id").to_pylist(), table.column("channel").to_pylist(), strict=True))
    assert got == sorted((r["ticket_id"], r["channel"]) for r in _rows())
    assert "state" not in ds.dataset(str(out / "channel=chat" / "state=succeeded"), format="parquet").schema.names


def test_partitions_on_s3_replace_stale_ones_and_leave_no_temporary_prefix(s3, job):
    store, spec = job
    url = s3.bucket("parts")
    target = OutputTarget("output.path", f"{url}/results", "jsonl", ("state",))
    check_target(spec, target)  # the bucket takes a probe object, and removes it
    write_target(store, "tickets", target)
    fs = s3.fs()
    fs.invalidate_cache()
    assert sorted(fs.find("parts")) == ["parts/results/state=failed/part-0.jsonl", "parts/results/state=succeeded/part-0.jsonl"]
    assert fs.cat("parts/results/state=failed/part-0.jsonl").decode().count("\n") == 1
    _drop_failed_row(Path(spec.source.path).parent)
    write_target(store, "tickets", target)
    fs.invalidate_cache()
    assert sorted(fs.find("parts")) == ["parts/results/state=succeeded/part-0.jsonl"]
    first = fs.cat("parts/results/state=succeeded/part-0.jsonl")
    assert first.decode().count("\n") == 8 and '"state"' not in first.decode()  # the partition column is in the key
    write_target(store, "tickets", target)
    assert fs.cat("parts/results/state=succeeded/part-0.jsonl") == first


def test_an_unknown_partition_column_is_refused_before_the_run_naming_the_columns(tmp_path):
    write_csv(tmp_path / "tickets.csv", _rows())
    spec = make_spec(tmp_path / "tickets.csv")
    with pytest.raises(SpecError) as caught:
        check_target(spec, OutputTarget("output.path", str(tmp_path / "out"), None, ("region",)))
    assert str(caught.value).startswith("output.partition_by: no column 'region' in the results; partition by one of: ticket_id, channel, body, gold, custom_id, state")
    file = tmp_path / "a-file"
    file.write_text("x")
    with pytest.raises(SpecError, match="is a file; with partition_by, output.path names a folder"):
        check_target(spec, OutputTarget("output.path", str(file), None, ("state",)))
