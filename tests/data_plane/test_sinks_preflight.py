"""Before anything is sent, a results target that could not be written is refused by name,
with the fix: an unknown bucket, no credentials, a folder given as a file; the probe object
the check writes is removed again."""

from __future__ import annotations

import pytest

from lowtide.core.errors import SpecError
from lowtide.core.output_target import OutputTarget
from lowtide.engine.preflight import check_target
from tests.conftest import make_spec, ticket_rows, write_csv


@pytest.fixture
def spec(tmp_path):
    write_csv(tmp_path / "tickets.csv", ticket_rows(3))
    return make_spec(tmp_path / "tickets.csv")


def test_a_writable_bucket_passes_and_keeps_no_probe_object(s3, spec):
    url = s3.bucket("fine")
    s3.fs().pipe("fine/results.csv", b"an earlier export")
    check_target(spec, OutputTarget("output.path", f"{url}/results.csv"))
    fs = s3.fs()
    fs.invalidate_cache()
    assert fs.find("fine") == ["fine/results.csv"] and fs.cat("fine/results.csv") == b"an earlier export"


def test_an_unknown_bucket_is_refused_naming_the_url(s3, spec):
    with pytest.raises(SpecError) as caught:
        check_target(spec, OutputTarget("output.path", "s3://not-a-bucket-of-ours/results.parquet"))
    assert str(caught.value) == "output.path s3://not-a-bucket-of-ours/results.parquet: no such bucket; check the bucket's name in the URL"


def test_no_credentials_is_refused_saying_how_to_give_them(s3, spec, tmp_path, monkeypatch):
    url = s3.bucket("locked")
    empty = tmp_path / "empty"
    empty.write_text("")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to ask for
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(SpecError) as caught:
        check_target(spec, OutputTarget("--out", f"{url}/results.jsonl"))
    assert str(caught.value).startswith(f"--out {url}/results.jsonl: no credentials for this store (NoCredentialsError); "
                                        "give them the store's own way (for S3: AWS_ACCESS_KEY_ID")  # fmt: skip


def test_a_folder_named_as_a_results_file_is_refused(s3, spec):
    url = s3.bucket("folders")
    s3.fs().pipe("folders/results/part-0.csv", b"x")
    with pytest.raises(SpecError, match="output.path s3://folders/results: is a folder; name a file in it"):
        check_target(spec, OutputTarget("output.path", f"{url}/results", "csv"))


def test_a_gcs_bucket_takes_the_probe(gcs, spec):
    url = gcs.bucket("gcs-fine")
    check_target(spec, OutputTarget("output.path", f"{url}/out/results.parquet"))
    with pytest.raises(SpecError, match="no such bucket|not found"):
        check_target(spec, OutputTarget("output.path", "gs://gcs-missing-bucket/results.parquet"))
