"""Sources read by URL from real object stores on loopback (moto's S3 server, the GCS
emulator): one file of each format, folders and globs, Hive partitions as columns,
`source.filter` pushed down, and a whole job loaded from S3, run and exported."""

from __future__ import annotations

import io
import json
from datetime import date

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lowtide.core.errors import SourceError
from lowtide.core.sources import SourceSpec, source_at
from lowtide.engine.export import export_results
from tests.conftest import drive_to_end, make_spec

CSV = b"id,text\n1,hello\n2,world\n"
JSONL = b'{"id": 1, "text": "hello"}\n{"id": 2, "text": "world"}\n'


def parquet(table: pa.Table | dict, row_group_size: int | None = None) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table if isinstance(table, pa.Table) else pa.table(table), buf, row_group_size=row_group_size)
    return buf.getvalue()


PARQUET = parquet({"id": [1, 2], "text": ["hello", "world"]})


def rows_of(source) -> list[dict]:
    return [r.values for chunk in source.chunks() for r in chunk]


def read(path: str, **spec) -> list[dict]:
    return rows_of(source_at(SourceSpec(path=path, id_column="id", **spec)))


@pytest.fixture(params=["s3", "gcs"])
def store_url(request):
    """A fresh bucket in each store, and a filesystem to put files there: (url, fs)."""
    server = request.getfixturevalue(request.param)
    return server.bucket("data"), server.fs()


@pytest.mark.parametrize(
    ("name", "body", "expected"),
    [
        ("rows.csv", CSV, [{"id": "1", "text": "hello"}, {"id": "2", "text": "world"}]),
        ("rows.jsonl", JSONL, [{"id": 1, "text": "hello"}, {"id": 2, "text": "world"}]),
        ("rows.parquet", PARQUET, [{"id": 1, "text": "hello"}, {"id": 2, "text": "world"}]),
    ],
)
def test_one_file_of_each_format(store_url, name, body, expected):
    url, fs = store_url
    fs.pipe(f"{url}/in/{name}", body)
    source = source_at(SourceSpec(path=f"{url}/in/{name}", id_column="id"))
    assert rows_of(source) == expected
    assert source.name == name  # a row is named by its file: `rows.csv row 2`


@pytest.mark.parametrize(("ext", "body"), [("csv", CSV), ("jsonl", JSONL), ("parquet", PARQUET)])
def test_a_folder_and_a_glob_of_many_files(s3, ext, body):
    url = s3.bucket("many")
    fs = s3.fs()
    for name in ("b", "a", "c"):
        fs.pipe(f"{url}/in/{name}.{ext}", body)
    fs.pipe(f"{url}/in/_SUCCESS", b"")  # left by the writer beside the data: not a data file
    fs.pipe(f"{url}/in/notes.txt", b"not data")  # another kind of file: left out by its extension

    folder = read(f"{url}/in/")
    assert len(folder) == 6 and [str(r["id"]) for r in folder] == ["1", "2"] * 3

    source = source_at(SourceSpec(path=f"{url}/in/[ab].{ext}", id_column="id"))
    assert len(rows_of(source)) == 4
    if ext != "parquet":  # lowtide's own readers name the file each row comes from
        assert [r.file for chunk in source.chunks() for r in chunk] == ["a." + ext] * 2 + ["b." + ext] * 2


def test_a_glob_across_partitions_in_gcs(gcs):
    url = gcs.bucket("globs")
    fs = gcs.fs()
    fs.pipe(f"{url}/t/dt=2026-12-01/part-0.jsonl", b'{"id": 1}\n')
    fs.pipe(f"{url}/t/dt=2026-12-02/part-0.jsonl", b'{"id": 2}\n')
    fs.pipe(f"{url}/t/dt=2026-12-02/part-1.json", b'{"id": 3}\n')
    assert read(f"{url}/t/*/*.jsonl") == [{"id": 1, "dt": "2026-12-01"}, {"id": 2, "dt": "2026-12-02"}]


def test_hive_partitions_become_columns(store_url):
    url, fs = store_url
    for day, ids in (("2026-12-01", [1, 2]), ("2026-12-02", [3])):
        fs.pipe(f"{url}/t/dt={day}/lang=en/part-0.parquet", parquet({"id": ids, "text": [f"t{i}" for i in ids]}))
    source = source_at(SourceSpec(path=f"{url}/t/", id_column="id"))
    assert source.columns == ["id", "text", "dt", "lang"]
    assert [(r["id"], str(r["dt"]), r["lang"]) for r in rows_of(source)] == [(1, "2026-12-01", "en"), (2, "2026-12-01", "en"), (3, "2026-12-02", "en")]


def test_a_filter_on_a_partition_column_leaves_other_partitions_unread(s3):
    """The filtered-out partition's file is not Parquet at all: reading even its footer
    would fail, so the load proves it was never opened."""
    url = s3.bucket("pushdown")
    fs = s3.fs()
    fs.pipe(f"{url}/t/dt=2026-12-01/part-0.parquet", parquet({"id": [1, 2], "text": ["a", "b"]}))
    fs.pipe(f"{url}/t/dt=2026-12-02/part-0.parquet", parquet({"id": [3], "text": ["c"]}))
    fs.pipe(f"{url}/t/dt=2026-12-03/part-0.parquet", b"this is not parquet, and nobody may read it")

    rows = read(f"{url}/t/", filter=[["dt", "<=", "2026-12-02"]])
    assert [r["id"] for r in rows] == [1, 2, 3]
    rows = read(f"{url}/t/", filter=[["dt", "in", ["2026-12-02"]]])
    assert [(r["id"], str(r["dt"])) for r in rows] == [(3, "2026-12-02")]

    # unfiltered, the corrupt partition is read, and named
    with pytest.raises(SourceError, match=r"s3://pushdown/t/: partition dt=2026-12-03/part-0\.parquet: cannot read as parquet"):
        read(f"{url}/t/")


def test_a_filter_on_a_csv_partition_column_leaves_other_files_unopened(s3):
    url = s3.bucket("csvpush")
    fs = s3.fs()
    fs.pipe(f"{url}/t/dt=2026-12-01/a.jsonl", b'{"id": 1}\n')
    fs.pipe(f"{url}/t/dt=2026-12-02/a.jsonl", b"\xff\xfe not json, not even UTF-8\n")
    assert read(f"{url}/t/", filter=[["dt", "=", "2026-12-01"]]) == [{"id": 1, "dt": "2026-12-01"}]


def test_a_filter_on_a_data_column(store_url):
    url, fs = store_url
    table = pa.table({"id": list(range(100)), "score": [i / 10 for i in range(100)], "lang": ["en", "fr"] * 50})
    fs.pipe(f"{url}/t/part-0.parquet", parquet(table, row_group_size=10))
    fs.pipe(f"{url}/c.csv", b"id,lang\n1,en\n2,fr\n3,en\n")

    rows = read(f"{url}/t/", filter=[["id", ">=", 95], ["lang", "=", "fr"]])
    assert [r["id"] for r in rows] == [95, 97, 99]
    assert [r["id"] for r in read(f"{url}/c.csv", filter=[["lang", "!=", "fr"]])] == ["1", "3"]


def test_a_filter_value_is_compared_as_the_column_type(s3):
    """A date partition written by a typed writer (dt=2026-12-03 read as a date) and a
    filter value given as text in YAML compare as dates."""
    url = s3.bucket("typed")
    fs = s3.fs()
    days = [date(2025, 12, 1), date(2025, 12, 2), date(2025, 12, 3)]
    table = pa.table({"id": [1, 2, 3], "day": pa.array(days, pa.date32())})
    fs.pipe(f"{url}/t.parquet", parquet(table))
    assert [r["id"] for r in read(f"{url}/t.parquet", filter=[["day", ">", "2025-12-02"]])] == [3]


def test_a_job_loaded_from_s3_runs_and_exports(s3, sqlite_store, clock, tmp_path):
    url = s3.bucket("jobs")
    fs = s3.fs()
    labels = ["billing", "technical"]
    for day in ("2026-12-01", "2026-12-02", "2026-12-03"):
        ids = [f"T{day[-1]}{i}" for i in range(5)]
        fs.pipe(f"{url}/tickets/dt={day}/part-0.parquet", parquet({"ticket_id": ids, "body": [f"about {labels[i % 2]}" for i in range(5)]}))
    spec = make_spec(f"{url}/tickets/", source={"filter": [["dt", ">=", "2026-12-02"]]}, base_dir=str(tmp_path))

    status = drive_to_end(sqlite_store, spec, clock)
    assert status.counts == {"succeeded": 10}

    out = tmp_path / "results.jsonl"
    report = export_results(sqlite_store, spec.name, out)
    assert report.rows == 10
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["ticket_id"] for r in exported) == sorted(f"T{d}{i}" for d in "23" for i in range(5))
    assert {str(r["dt"]) for r in exported} == {"2026-12-02", "2026-12-03"}  # partition columns travel to the results
