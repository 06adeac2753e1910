"""Source column types in typed results: CSV columns inferred from every value (and
`source.types` overriding), JSONL by JSON's kinds, a declared type checked on every row at
load, before anything is stored or sent."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from lowtide.core.errors import SourceError
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.store.payloads import payload_text
from lowtide.store.schema import requests
from tests.conftest import drive_to_end, make_spec

CSV = """ticket_id,zip,count,score,urgent,opened,note,body
1,01234,3,0.5,true,2026-12-01T09:00:00Z,,first
2,98765,12,1,FALSE,2026-12-02T10:30:00+01:00,late,second
3,00501,,2.25,True,2026-12-03,x,third
"""


def run_and_read(store, clock, tmp_path, **source) -> pa.Table:
    (tmp_path / "t.csv").write_text(CSV, encoding="utf-8")
    spec = make_spec(tmp_path / "t.csv", source=source, template={"user": "{{ body }}"})
    drive_to_end(store, spec, clock)
    out = tmp_path / "out.parquet"
    export_results(store, "tickets", out)
    return pq.read_table(out)


def test_csv_columns_are_inferred_from_every_value(sqlite_store, clock, tmp_path):
    table = run_and_read(sqlite_store, clock, tmp_path, id_column="ticket_id")
    types = {f.name: str(f.type) for f in table.schema}
    assert types["ticket_id"] == "int64" and types["count"] == "int64" and types["score"] == "double"
    assert types["urgent"] == "bool"
    assert types["zip"] == "string"  # leading zeros are the value: never read as a number
    assert types["opened"] == "string" and types["note"] == "string"  # times are typed only when declared
    rows = table.to_pylist()
    assert [r["count"] for r in rows] == [3, 12, None]  # an empty cell of a typed column is null
    assert [r["urgent"] for r in rows] == [True, False, True]
    assert [r["zip"] for r in rows] == ["01234", "98765", "00501"]
    assert [r["note"] for r in rows] == ["", "late", "x"]  # text stays text, empty included


def test_declared_types_override_inference(sqlite_store, clock, tmp_path):
    table = run_and_read(sqlite_store, clock, tmp_path, id_column="ticket_id",
                         types={"ticket_id": "string", "opened": "timestamp", "count": "float"})  # fmt: skip
    types = {f.name: f.type for f in table.schema}
    assert types["ticket_id"] == pa.string() and types["count"] == pa.float64()
    assert types["opened"] == pa.timestamp("us", tz="UTC")
    rows = table.to_pylist()
    assert [r["ticket_id"] for r in rows] == ["1", "2", "3"]
    assert [r["opened"] for r in rows] == [
        datetime(2026, 12, 1, 9, 0, tzinfo=UTC), datetime(2026, 12, 2, 9, 30, tzinfo=UTC), datetime(2026, 12, 3, tzinfo=UTC),
    ]  # fmt: skip


def test_a_value_not_of_its_declared_type_refuses_the_load(sqlite_store, clock, tmp_path):
    (tmp_path / "t.csv").write_text(CSV, encoding="utf-8")
    spec = make_spec(tmp_path / "t.csv", source={"id_column": "ticket_id", "types": {"note": "int", "score": "int"}})
    with pytest.raises(SourceError) as info:
        load_job(sqlite_store, spec, clock)
    msg = str(info.value)
    assert 't.csv row 1 (line 2): column "score" is \'0.5\', not a whole number (source.types.score: int); fix the value, or the type' in msg
    assert 't.csv row 2 (line 3): column "note" is \'late\'' in msg and "source.types.note: int" in msg
    assert "t.csv row 3" in msg and 'column "note" is \'x\'' in msg
    with sqlite_store.begin() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM requests")).scalar() == 0


def test_a_declared_column_that_does_not_exist_is_refused(sqlite_store, clock, tmp_path):
    (tmp_path / "t.csv").write_text(CSV, encoding="utf-8")
    spec = make_spec(tmp_path / "t.csv", source={"id_column": "ticket_id", "types": {"opened_at": "timestamp"}})
    with pytest.raises(SourceError, match=r'source.types.opened_at names column "opened_at", which it does not have; columns are: ticket_id, zip'):
        load_job(sqlite_store, spec, clock)


def test_templates_still_see_the_text_as_written(sqlite_store, clock, tmp_path):
    """Types change the results file, never a request: the zip code is asked as written."""
    (tmp_path / "t.csv").write_text(CSV, encoding="utf-8")
    spec = make_spec(tmp_path / "t.csv", source={"id_column": "ticket_id", "types": {"zip": "int"}}, template={"user": "zip {{ zip }}"})
    drive_to_end(sqlite_store, spec, clock)
    with sqlite_store.begin() as conn:
        payloads = conn.execute(sa.select(payload_text()).order_by(requests.c.source_row)).scalars().all()
    assert '"zip 01234"' in payloads[0]
