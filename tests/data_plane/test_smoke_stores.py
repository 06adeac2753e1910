"""The loopback object stores answer as the real ones do for what lowtide uses."""

from lowtide.core.sources import SourceSpec, source_at


def test_csv_folder_in_s3_with_partitions(s3):
    url = s3.bucket("smoke")
    fs = s3.fs()
    fs.pipe(f"{url}/tickets/dt=2026-12-01/a.csv", b"id,text\n1,hello\n")
    fs.pipe(f"{url}/tickets/dt=2026-12-02/a.csv", b"id,text\n2,world\n")
    source = source_at(SourceSpec(path=f"{url}/tickets/", id_column="id"))
    rows = [r.values for chunk in source.chunks() for r in chunk]
    assert rows == [{"id": "1", "text": "hello", "dt": "2026-12-01"}, {"id": "2", "text": "world", "dt": "2026-12-02"}]


def test_jsonl_file_in_gcs(gcs):
    url = gcs.bucket("smoke")
    gcs.fs().pipe(f"{url}/rows.jsonl", b'{"id": 1, "text": "a"}\n')
    source = source_at(SourceSpec(path=f"{url}/rows.jsonl", id_column="id"))
    assert [r.values for chunk in source.chunks() for r in chunk] == [{"id": 1, "text": "a"}]
