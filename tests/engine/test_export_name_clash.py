"""A response schema's property named like one of lowtide's result columns (`state`, `output`,
`route`, `attempts`, `custom_id`, an answer column, `response`, ...) loses neither column: the
parsed field is written as `answer_<name>` beside lowtide's own, the same way in CSV, JSONL,
Parquet and a SQL table. Real jobs on the echo route, which answers each field's one enum
value."""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from lowtide.core.output_target import OutputTarget
from lowtide.engine.export import ResultColumns, export_results, write_target
from lowtide.store.db import Store
from tests.conftest import drive_to_end, make_spec, write_csv

CLASHING = {"custom_id": "c-1", "state": "angry", "output": "o-1", "error": "e-1", "route": "north", "finish_reason": "f-1", "response": "r-1"}
SCHEMA = {
    "type": "object",
    "properties": {
        **{name: {"type": "string", "enum": [value]} for name, value in CLASHING.items()},
        "attempts": {"type": "integer", "enum": [42]},
        "label": {"type": "string", "enum": ["billing"]},
    },
    "required": [*CLASHING, "attempts", "label"],
}
PARSED = {f"answer_{k}": v for k, v in CLASHING.items()} | {"answer_attempts": 42, "label": "billing"}
IDS = ["T1", "T2", "T3"]


@pytest.fixture
def job(tmp_path, clock):
    write_csv(tmp_path / "tickets.csv", [{"ticket_id": i, "body": f"ticket {i}"} for i in IDS])
    spec = make_spec(tmp_path / "tickets.csv", response_schema=SCHEMA)
    store = Store(str(tmp_path / "lowtide.db"))
    drive_to_end(store, spec, clock)
    yield store, spec
    store.close()


def _check(rows: list[dict], columns: list[str]) -> None:
    assert len(columns) == len(set(columns)), columns
    assert [r["ticket_id"] for r in rows] == IDS
    for r in rows:
        assert {k: r[k] for k in PARSED} == PARSED
        ours = {k: r[k] for k in ("state", "error", "route", "attempts", "finish_reason")}
        assert ours == {"state": "succeeded", "error": None, "route": "echo", "attempts": 1, "finish_reason": "stop"}
        assert r["custom_id"] != "c-1" and r["custom_id"].endswith(r["ticket_id"])
        assert json.loads(r["output"]) == {**CLASHING, "attempts": 42, "label": "billing"}


def test_jsonl_keeps_every_column_beside_the_clashing_fields(job, tmp_path):
    store, spec = job
    export_results(store, "tickets", tmp_path / "out.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    _check(lines, list(lines[0]))
    assert sorted(lines[0]) == sorted(ResultColumns(spec).columns())  # what a preflight says the columns are


def test_csv_keeps_every_column_beside_the_clashing_fields(job, tmp_path):
    store, _ = job
    export_results(store, "tickets", tmp_path / "out.csv")
    with (tmp_path / "out.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        header = list(reader.fieldnames or [])
    for r in rows:  # CSV cells are text: bring back the integers and the empty error
        r["attempts"], r["answer_attempts"], r["error"] = int(r["attempts"]), int(r["answer_attempts"]), r["error"] or None
    _check(rows, header)


def test_parquet_keeps_every_column_with_its_own_type(job, tmp_path):
    store, _ = job
    export_results(store, "tickets", tmp_path / "out.parquet", full=True)
    table = pq.read_table(tmp_path / "out.parquet")
    _check(table.to_pylist(), table.column_names)
    assert table.schema.field("attempts").type == table.schema.field("answer_attempts").type == pa.int64()
    assert table.schema.field("answer_response").type == pa.string() and "response" in table.column_names


def test_a_sql_table_keeps_every_column(job, tmp_path):
    store, _ = job
    url = f"sqlite:///{tmp_path / 'warehouse.db'}"
    write_target(store, "tickets", OutputTarget("output.url", url=url, table="results"))
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            t = sa.Table("results", sa.MetaData(), autoload_with=conn)
            rows = [dict(r._mapping) for r in conn.execute(sa.select(t).order_by(t.c.ticket_id))]
    finally:
        engine.dispose()
    _check(rows, [c.name for c in t.columns])


def test_a_source_column_named_like_the_renamed_field_is_renamed_in_turn(tmp_path, clock):
    write_csv(tmp_path / "tickets.csv", [{"ticket_id": i, "body": f"ticket {i}", "answer_state": "calm"} for i in IDS])
    spec = make_spec(tmp_path / "tickets.csv", response_schema=SCHEMA)
    with Store(str(tmp_path / "lowtide.db")) as store:
        drive_to_end(store, spec, clock)
        export_results(store, "tickets", tmp_path / "out.jsonl")
    first = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert (first["answer_state"], first["lowtide_answer_state"], first["state"]) == ("calm", "angry", "succeeded")


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_a_jsonl_key_that_first_appears_late_is_a_column(tmp_path, clock, monkeypatch, fmt):
    """A JSONL source's columns are every key of its rows: they were its first chunk's keys
    alone, so a key first met in a later row (a `priority` a feed adds one day) was dropped
    from CSV and Parquet results, and a late `state` was overwritten by lowtide's own."""
    import lowtide.core.sources as sources

    monkeypatch.setattr(sources, "CHUNK_CHARS", 100)  # a chunk of a few rows: the late keys are past the first
    rows = [{"ticket_id": f"T{i}", "body": f"ticket {i}"} for i in range(20)]
    rows[15] |= {"priority": "high", "state": "CA"}
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = Store(str(tmp_path / "lowtide.db"))
    drive_to_end(store, make_spec(tmp_path / "t.jsonl"), clock)
    export_results(store, "tickets", tmp_path / f"out.{fmt}")
    if fmt == "csv":
        with (tmp_path / "out.csv").open(newline="") as f:
            got = list(csv.DictReader(f))
    elif fmt == "jsonl":
        got = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    else:
        got = pq.read_table(tmp_path / "out.parquet").to_pylist()
    late = got[15]
    assert (late["priority"], late["state"], late["lowtide_state"]) == ("high", "CA", "succeeded")
    assert got[0]["lowtide_state"] == "succeeded" and got[0].get("priority") in (None, "")
    store.close()
