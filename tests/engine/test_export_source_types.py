"""Source columns keep their types in Parquet results (issue 28: "in Parquet results every
source column from a CSV or JSONL source becomes a string and booleans read 'True'")."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from lowtide.core.clock import SystemClock
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.store.db import Store
from tests.conftest import make_spec
from tests.routes.conftest import _run

ROWS = [
    {"ticket_id": "T1", "body": "billing question", "urgent": True, "seats": 3, "score": 0.5, "tags": ["a"], "mixed": 1, "huge": 1, "note": None},
    {"ticket_id": "T2", "body": "shipping question", "urgent": False, "seats": 12, "score": 2, "tags": [], "mixed": "x", "huge": 2**70, "note": "n"},
]  # fmt: skip


def test_jsonl_source_columns_keep_their_json_types_in_parquet(tmp_path):
    """At 2c0e660 every column was text: `urgent` read 'True', `seats` '3'."""
    source = tmp_path / "tickets.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    store = Store(str(tmp_path / "lowtide.db"))
    load_job(store, make_spec(source), SystemClock())
    _run(store, "tickets")
    export_results(store, "tickets", tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    types = {c: table.schema.field(c).type for c in ROWS[0]}
    assert types == {
        "ticket_id": pa.string(), "body": pa.string(), "urgent": pa.bool_(), "seats": pa.int64(),
        "score": pa.float64(),  # integers among numbers: numbers
        "tags": pa.string(), "mixed": pa.string(), "huge": pa.string(),  # arrays, mixed kinds, past int64: text
        "note": pa.string(),
    }  # fmt: skip
    rows = {r["ticket_id"]: r for r in table.to_pylist()}
    assert (rows["T1"]["urgent"], rows["T1"]["seats"], rows["T2"]["score"]) == (True, 3, 2.0)
    assert (rows["T1"]["tags"], rows["T2"]["mixed"], rows["T2"]["huge"], rows["T1"]["note"]) == ('["a"]', "x", str(2**70), None)


def test_jsonl_results_of_a_parquet_source_are_json_whatever_its_types(tmp_path):
    """Every line of JSONL results is a JSON document: a Parquet NaN was written as the bare
    token `NaN` (no JSON reader takes it) and bytes as Python's `b'\\x00\\xff'`."""
    from datetime import UTC, date, datetime
    from decimal import Decimal

    source = tmp_path / "tickets.parquet"
    pq.write_table(pa.table({
        "ticket_id": ["T1", "T2"], "body": ["billing question", "shipping question"],
        "score": [float("nan"), 1.5], "blob": [b"\x00\xff", None],
        "at": [datetime(2026, 12, 3, 9, 0, tzinfo=UTC), None], "day": [date(2026, 12, 3), None],
        "amount": pa.array([Decimal("12345678901234567890.12"), None], pa.decimal128(22, 2)),
    }), source)  # fmt: skip
    store = Store(str(tmp_path / "lowtide.db"))
    load_job(store, make_spec(source), SystemClock())
    _run(store, "tickets")
    export_results(store, "tickets", tmp_path / "out.jsonl")
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    rows = {r["ticket_id"]: r for r in map(lambda line: json.loads(line, parse_constant=_not_json), lines)}
    assert {k: rows["T1"][k] for k in ("score", "blob", "at", "day", "amount")} == {
        "score": None, "blob": "AP8=", "at": "2026-12-03T09:00:00+00:00", "day": "2026-12-03", "amount": "12345678901234567890.12",
    }  # fmt: skip
    assert rows["T2"]["score"] == 1.5 and rows["T2"]["blob"] is None


def _not_json(token: str):
    raise AssertionError(f"{token} is not JSON")
