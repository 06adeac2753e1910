"""Structured output: parsed and validated; one repair with the error appended, then failed."""

from __future__ import annotations

import json

import sqlalchemy as sa

from lowtide.engine.export import export_results
from lowtide.store.schema import attempts, requests
from tests.conftest import drive_to_end, make_spec, write_csv

SCHEMA = {
    "type": "object",
    "properties": {"label": {"enum": ["billing", "technical"]}, "urgent": {"type": "boolean"}},
    "required": ["label", "urgent"],
}


def test_valid_json_is_parsed_into_columns_and_invalid_json_is_repaired_once_then_failed(store, clock, tmp_path):
    rows = [
        {"ticket_id": "ok-1", "answer": '{"label": "billing", "urgent": true}'},
        {"ticket_id": "bad-enum", "answer": '{"label": "sales", "urgent": false}'},
        {"ticket_id": "not-json", "answer": "billing, I think"},
    ]
    source = write_csv(tmp_path / "t.csv", rows)
    # echo answers with the user message, so the rendered answer is the "model output".
    spec = make_spec(source, template={"system": None, "user": "{{ answer }}"}, response_schema=SCHEMA)
    status = drive_to_end(store, spec, clock)
    assert status.counts == {"succeeded": 1, "failed": 2}
    with store.begin() as conn:
        got = {r.custom_id: r for r in conn.execute(sa.select(requests))}
        tries = dict(
            conn.execute(
                sa.select(requests.c.custom_id, sa.func.count(attempts.c.id))
                .join(attempts, attempts.c.request_id == requests.c.id)
                .group_by(requests.c.custom_id)
            ).all()
        )
    assert json.loads(got["ok-1"].parsed) == {"label": "billing", "urgent": True}
    assert tries == {"ok-1": 1, "bad-enum": 2, "not-json": 2}  # one repair each, no more
    assert got["bad-enum"].error_code == "invalid_output"
    assert "after one repair" in got["bad-enum"].error_message
    # The repair turn carried the validation error back to the model.
    assert "'sales' is not one of" in json.loads(got["bad-enum"].repair)[1]["content"]

    export_results(store, "tickets", tmp_path / "out.csv")
    import csv

    with (tmp_path / "out.csv").open() as f:
        out = {r["ticket_id"]: r for r in csv.DictReader(f)}
    assert out["ok-1"]["label"] == "billing" and out["ok-1"]["urgent"] == "True"
    assert out["not-json"]["state"] == "failed" and "invalid_output" in out["not-json"]["error"]


def test_choices_accept_only_the_allowed_answers(store, clock, tmp_path):
    rows = [{"ticket_id": "a", "body": "my invoice is wrong"}, {"ticket_id": "b", "body": "nothing relevant"}]
    source = write_csv(tmp_path / "t.csv", rows)
    spec = make_spec(source, choices=["invoice", "refund"])
    drive_to_end(store, spec, clock)
    with store.begin() as conn:
        got = dict(conn.execute(sa.select(requests.c.custom_id, requests.c.parsed)).all())
    assert json.loads(got["a"]) == "invoice"  # mentioned in the message
    assert json.loads(got["b"]) in ("invoice", "refund")
