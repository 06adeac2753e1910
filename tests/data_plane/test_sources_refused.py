"""Bad places and bad data by URL are refused before anything is stored, with a message
that names the URL (or the partition, or the column) and the fix: no credentials, an
unknown bucket, access denied, an empty folder, a partition of another schema, a filter or
watermark naming a missing column, a key in the URL, an unknown scheme, a missing extra."""

from __future__ import annotations

import io
import json
import urllib.request

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from lowtide.core.errors import SourceError
from lowtide.core.sources import SourceSpec, source_at
from lowtide.engine.loader import load_job
from lowtide.store.schema import jobs, requests
from tests.conftest import make_spec


def parquet(data: dict | pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(data if isinstance(data, pa.Table) else pa.table(data), buf)
    return buf.getvalue()


def refused(store, clock, url: str, **source) -> str:
    """Load a job over `url`: it must be refused, and leave the store as empty as it was."""
    spec = make_spec(url, source={"id_column": "id", **source}, template={"user": "{{ text }}"})
    with pytest.raises(SourceError) as caught:
        load_job(store, spec, clock)
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar() == 0
        assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar() == 0
    return str(caught.value)


@pytest.fixture
def no_aws_credentials(s3, tmp_path, monkeypatch):
    """Nothing in any link of the AWS chain: no variables, empty files, no instance role."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        empty = tmp_path / name.lower()
        empty.write_text("")
        monkeypatch.setenv(name, str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    monkeypatch.delenv("AWS_WEB_IDENTITY_TOKEN_FILE", raising=False)
    return s3


def test_no_credentials(no_aws_credentials, sqlite_store, clock):
    s3 = no_aws_credentials
    url = s3.bucket("private")  # the fixture's own filesystem has its keys; lowtide has none
    s3.fs().pipe(f"{url}/rows.csv", b"id,text\n1,a\n")

    msg = refused(sqlite_store, clock, f"{url}/rows.csv")
    assert msg.startswith(f"{url}/rows.csv: no credentials")
    assert "AWS_ACCESS_KEY_ID" in msg and "never in the spec" in msg


def test_unknown_bucket(s3, sqlite_store, clock):
    msg = refused(sqlite_store, clock, "s3://no-such-bucket-here/rows.csv")
    assert msg == "s3://no-such-bucket-here/rows.csv: no such bucket (no-such-bucket-here); check the bucket's name in the URL"
    msg = refused(sqlite_store, clock, "s3://no-such-bucket-here/t/*.csv")
    assert msg.startswith("s3://no-such-bucket-here/t/*.csv: no such bucket (no-such-bucket-here)")


def test_unknown_bucket_in_gcs(gcs, sqlite_store, clock):
    msg = refused(sqlite_store, clock, "gs://no-such-bucket-here/t/")
    assert msg.startswith("gs://no-such-bucket-here/t/: ") and ("bucket" in msg or "not found" in msg or "no such" in msg)


def test_no_such_file_in_a_bucket(s3, sqlite_store, clock):
    url = s3.bucket("present")
    msg = refused(sqlite_store, clock, f"{url}/nope.csv")
    assert msg.startswith(f"{url}/nope.csv: no such file") and "source.path" in msg


def test_access_denied(s3, sqlite_store, clock, monkeypatch):
    """moto enforces IAM user policies (not bucket policies) once its auth is switched on: a
    user whose policy denies S3 is refused with 403 AccessDenied, as on AWS."""
    import boto3

    url = s3.bucket("guarded")
    s3.fs().pipe(f"{url}/rows.csv", b"id,text\n1,a\n")
    iam = boto3.client("iam", endpoint_url=s3.endpoint, region_name="us-east-1")
    iam.create_user(UserName="reader")
    deny = {"Version": "2012-10-17", "Statement": [{"Effect": "Deny", "Action": "s3:*", "Resource": "*"}]}
    iam.put_user_policy(UserName="reader", PolicyName="no-s3", PolicyDocument=json.dumps(deny))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    _moto_auth(s3.endpoint, "0")  # every request from here on is checked
    try:
        msg = refused(sqlite_store, clock, f"{url}/rows.csv")
    finally:
        _moto_auth(s3.endpoint, "inf")
    assert msg.startswith(f"{url}/rows.csv: access denied") and "grant" in msg
    assert key["SecretAccessKey"] not in msg


def _moto_auth(endpoint: str, count: str) -> None:
    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(), method="POST", headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(request) as answer:
        assert answer.status == 200


@pytest.mark.parametrize("leftover", [[], ["_SUCCESS"], ["_SUCCESS", ".part-0.crc"]])
def test_an_empty_folder(s3, sqlite_store, clock, leftover):
    url = s3.bucket("hollow")
    fs = s3.fs()
    fs.pipe(f"{url}/t/", b"")  # the folder marker a console's "create folder" leaves
    for name in leftover:
        fs.pipe(f"{url}/t/{name}", b"")
    msg = refused(sqlite_store, clock, f"{url}/t/")
    assert msg.startswith(f"{url}/t/: an empty folder") and "source.path" in msg


def test_a_glob_that_matches_nothing(s3, sqlite_store, clock):
    url = s3.bucket("hollow")
    s3.fs().pipe(f"{url}/t/a.csv", b"id,text\n1,a\n")
    msg = refused(sqlite_store, clock, f"{url}/t/*.parquet")
    assert msg.startswith(f"{url}/t/*.parquet: no file matches")


def test_a_partition_of_another_schema_is_named(s3, sqlite_store, clock):
    url = s3.bucket("drift")
    fs = s3.fs()
    fs.pipe(f"{url}/t/dt=2026-12-01/part-0.parquet", parquet({"id": [1], "text": ["a"]}))
    fs.pipe(f"{url}/t/dt=2026-12-02/part-0.parquet", parquet({"id": ["2"], "text": ["b"]}))
    msg = refused(sqlite_store, clock, f"{url}/t/")
    # the newest partition's types are the dataset's (it is the one a nightly load reads)
    assert msg.startswith(f'{url}/t/: partition dt=2026-12-01/part-0.parquet: column "id" is int64 there, string in dt=2026-12-02/part-0.parquet')
    assert "same types" in msg
    # the odd partition filtered out, the rest loads
    source = source_at(SourceSpec(path=f"{url}/t/", id_column="id", filter=[["dt", "=", "2026-12-01"]]))
    assert [r.values["id"] for chunk in source.chunks() for r in chunk] == [1]


@pytest.mark.parametrize(("name", "body"), [("t.parquet", parquet({"id": [1], "text": ["a"]})), ("t.csv", b"id,text\n1,a\n")])
def test_a_filter_or_watermark_naming_a_missing_column(s3, sqlite_store, clock, name, body):
    url = s3.bucket("cols")
    s3.fs().pipe(f"{url}/{name}", body)
    msg = refused(sqlite_store, clock, f"{url}/{name}", filter=[["lang", "=", "en"]])
    assert msg == f'{url}/{name}: source.filter names column "lang", which it does not have; columns are: id, text'
    msg = refused(sqlite_store, clock, f"{url}/{name}", since={"column": "updated_at"})
    assert msg == f'{url}/{name}: source.since.column names column "updated_at", which it does not have; columns are: id, text'


def test_a_key_in_the_url_is_refused_and_never_echoed(s3, sqlite_store, clock):
    msg = refused(sqlite_store, clock, "s3://AKIAEXAMPLE:wJalrXUtnFEMIsecret@bucket/x.csv")
    assert "wJalrXUtnFEMIsecret" not in msg and "AKIAEXAMPLE" not in msg
    assert msg.startswith("s3://***@bucket/x.csv: a URL with a key in it") and "environment, profile, role" in msg


def test_a_key_in_an_https_url_is_refused(sqlite_store, clock):
    msg = refused(sqlite_store, clock, "https://me:hunter2@example.invalid/x.csv")
    assert "hunter2" not in msg and msg.startswith("https://***@example.invalid/x.csv: a URL with a key in it")


def test_an_unknown_scheme(sqlite_store, clock):
    msg = refused(sqlite_store, clock, "nosuch://bucket/rows.csv")
    assert msg.startswith("nosuch://bucket/rows.csv: unknown URL scheme nosuch://")
    assert "s3://" in msg and "local path" in msg


def test_a_scheme_whose_extra_is_not_installed(sqlite_store, clock):
    pytest.importorskip("fsspec")
    try:
        import adlfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("adlfs is installed here")
    msg = refused(sqlite_store, clock, "az://container/rows.parquet")
    assert msg == "az://container/rows.parquet: reading az:// needs its filesystem; install it with pip install 'lowtide[azure]'"
