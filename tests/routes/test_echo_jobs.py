"""Dry runs of schema and tools jobs on echo and echo-batch, through the real engine: load,
tick, ingest, on a real SQLite store. The answer each row gets is valid, is parsed, and the
whole answer body is kept; a schema echo cannot satisfy is refused before anything is stored."""

from __future__ import annotations

import json

import jsonschema
import pytest
import sqlalchemy as sa

from lowtide.core.errors import LowtideError
from lowtide.engine.loader import load_job
from lowtide.store.schema import requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["billing", "technical", "account"]},
        "urgency": {"type": "integer", "minimum": 1, "maximum": 5},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["label", "urgency"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "function": {"name": "file_ticket", "parameters": SCHEMA}}


def _rows(store) -> list:
    with store.begin() as conn:
        return list(conn.execute(sa.select(requests.c.custom_id, requests.c.state, requests.c.parsed, requests.c.response)))


@pytest.mark.parametrize("route", ["echo", "echo-batch"])
def test_a_response_schema_job_succeeds_with_valid_parsed_answers(sqlite_store, clock, tmp_path, route):
    source = write_csv(tmp_path / "t.csv", ticket_rows(12))
    options = {"dir": str(tmp_path / "provider")} if route == "echo-batch" else {}
    spec = make_spec(source, route=route, route_options=options, response_schema=SCHEMA)
    status = drive_to_end(sqlite_store, spec, clock)
    assert status.counts == {"succeeded": 12}
    rows = _rows(sqlite_store)
    for row in rows:
        parsed = json.loads(row.parsed)
        jsonschema.validate(parsed, SCHEMA)
        response = json.loads(row.response)
        assert json.loads(response["choices"][0]["message"]["content"]) == parsed
    assert len({r.parsed for r in rows}) > 1  # a function of custom_id, not one answer for all


def test_a_tools_job_gets_a_valid_call_per_row(sqlite_store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(6))
    spec = make_spec(source, params={"max_tokens": 64, "tools": [TOOL], "tool_choice": "required"})
    assert drive_to_end(sqlite_store, spec, clock).counts == {"succeeded": 6}
    for row in _rows(sqlite_store):
        (call,) = json.loads(row.response)["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "file_ticket"
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)


def test_a_schema_echo_cannot_satisfy_is_refused_before_anything_is_stored(sqlite_store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}}
    spec = make_spec(source, response_schema=schema)
    with pytest.raises(LowtideError) as err:
        load_job(sqlite_store, spec, clock)
    message = str(err.value)
    assert "response_format.json_schema.schema.properties.code.pattern" in message and "echo" in message
    assert _rows(sqlite_store) == []
