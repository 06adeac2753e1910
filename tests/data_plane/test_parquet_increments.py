"""A partitioned Parquet dataset read night after night with `source.since` on its partition
column: the watermark is pushed down, so partitions already loaded are not even opened."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from lowtide.core.errors import SourceError
from lowtide.core.sources import source_of
from lowtide.engine.loader import load_job
from tests.conftest import make_spec


def write_day(root, day: str, ids: range, text_priority: bool = False) -> None:
    folder = root / f"dt={day}"
    folder.mkdir(parents=True)
    priority = [str(i % 3) if text_priority else i % 3 for i in ids]
    table = pa.table({"ticket_id": [f"T{i}" for i in ids], "body": [f"ticket {i}" for i in ids], "priority": priority})
    pq.write_table(table, folder / "part-0.parquet")


def spec_for(root, **source):
    return make_spec(root, source={"id_column": "ticket_id", **source}, template={"user": "{{ dt }}: {{ ticket_id }}"})


def test_each_load_opens_only_the_partitions_past_the_watermark(sqlite_store, clock, tmp_path):
    root = tmp_path / "tickets"
    write_day(root, "2026-12-01", range(0, 5))
    write_day(root, "2026-12-02", range(5, 8))
    spec = spec_for(root, since={"column": "dt"})
    first = load_job(sqlite_store, spec, clock)
    assert (first.rows, first.new, first.watermark) == (8, 8, "2026-12-02")

    # the loaded days are now unreadable: a load that opened them would fail
    for day in ("2026-12-01", "2026-12-02"):
        (root / f"dt={day}" / "part-0.parquet").write_bytes(b"not parquet any more")
    write_day(root, "2026-12-03", range(8, 12))
    second = load_job(sqlite_store, spec, clock)
    assert (second.rows, second.new, second.watermark) == (4, 4, "2026-12-03")
    with sqlite_store.begin() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM requests")).scalar() == 12


def test_a_partition_of_another_type_is_refused_by_name_unless_filtered_out(sqlite_store, clock, tmp_path):
    root = tmp_path / "tickets"
    write_day(root, "2026-12-01", range(0, 3), text_priority=True)
    write_day(root, "2026-12-02", range(3, 6))
    with pytest.raises(SourceError, match=r'partition dt=2026-12-01/part-0.parquet: column "priority" is string there, int64 in '
                                          r"dt=2026-12-02/part-0.parquet; write every partition with the same types"):
        load_job(sqlite_store, spec_for(root), clock)
    with sqlite_store.begin() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM requests")).scalar() == 0
    kept = source_of(spec_for(root, filter=[["dt", "=", "2026-12-02"]]))
    assert [r.values["ticket_id"] for c in kept.chunks() for r in c] == ["T3", "T4", "T5"]


def test_a_column_an_older_partition_has_is_a_column_of_every_row(sqlite_store, clock, tmp_path):
    """The dataset's columns were the newest file's alone: a column an older partition had
    and the newest dropped vanished from the rows, and so from templates and results."""
    root = tmp_path / "tickets"
    write_day(root, "2026-12-01", range(0, 2))
    (root / "dt=2026-12-02").mkdir()
    pq.write_table(pa.table({"ticket_id": ["T2"], "body": ["ticket 2"]}), root / "dt=2026-12-02" / "part-0.parquet")
    rows = [r.values for c in source_of(spec_for(root)).chunks() for r in c]
    assert [(r["ticket_id"], r["priority"], r["dt"]) for r in rows] == [("T0", 0, "2026-12-01"), ("T1", 1, "2026-12-01"), ("T2", None, "2026-12-02")]
    # ... and of one type in every file that has it
    write_day(root, "2026-11-30", range(3, 4), text_priority=True)
    with pytest.raises(SourceError, match=r'partition dt=2026-12-01/part-0.parquet: column "priority" is int64 there, string in '
                                          r"dt=2026-11-30/part-0.parquet; write every partition with the same types"):
        load_job(sqlite_store, spec_for(root), clock)


def test_csv_files_of_one_source_must_share_the_header(sqlite_store, clock, tmp_path):
    """Only the first file's header is read up front; a later file that disagrees refuses the
    load when it is reached, and the load's transaction keeps nothing of the files before it."""
    root = tmp_path / "tickets"
    (root / "dt=2026-12-01").mkdir(parents=True)
    (root / "dt=2026-12-02").mkdir(parents=True)
    (root / "dt=2026-12-01" / "a.csv").write_text("ticket_id,body\nT1,one\n", encoding="utf-8")
    (root / "dt=2026-12-02" / "a.csv").write_text("ticket_id,text\nT2,two\n", encoding="utf-8")
    with pytest.raises(SourceError, match=r"dt=2026-12-02/a.csv: its header \(ticket_id, text\) is not the first file's "
                                          r"\(ticket_id, body\); give every file of a source the same columns"):
        load_job(sqlite_store, spec_for(root), clock)
    with sqlite_store.begin() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM requests")).scalar() == 0
    kept = source_of(spec_for(root, filter=[["dt", "=", "2026-12-01"]]))  # the odd file filtered out
    assert [r.values["ticket_id"] for c in kept.chunks() for r in c] == ["T1"]


def test_csv_partitions_already_loaded_are_not_opened(sqlite_store, clock, tmp_path):
    root = tmp_path / "tickets"
    for day, ids in (("2026-12-01", "T1"), ("2026-12-02", "T2")):
        (root / f"dt={day}").mkdir(parents=True)
        (root / f"dt={day}" / "a.csv").write_text(f"ticket_id,body\n{ids},x\n", encoding="utf-8")
    spec = spec_for(root, since={"column": "dt"})
    assert load_job(sqlite_store, spec, clock).new == 2
    (root / "dt=2026-12-01" / "a.csv").write_bytes(b"\xff\xfe not a csv any more")  # opened, it would refuse the load
    (root / "dt=2026-12-03").mkdir()
    (root / "dt=2026-12-03" / "a.csv").write_text("ticket_id,body\nT3,y\n", encoding="utf-8")
    report = load_job(sqlite_store, spec, clock)
    assert (report.rows, report.new, report.watermark) == (1, 1, "2026-12-03")
