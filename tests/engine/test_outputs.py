"""Structured output: parsed and validated; one repair with the error appended, then failed."""

from __future__ import annotations

import json

import sqlalchemy as sa

from lowtide.engine.export import export_results
from lowtide.store.schema import attempts, requests
from tests.conftest import drive_to_end, make_spec, whole_columns, write_csv
from tests.engine.answers import answer_all, chat, choice, loaded_job, pending

SCHEMA = {
    "type": "object",
    "properties": {"label": {"enum": ["billing", "technical"]}, "urgent": {"type": "boolean"}},
    "required": ["label", "urgent"],
}


def test_valid_json_is_parsed_into_columns_and_invalid_json_is_repaired_once_then_failed(store, clock, tmp_path, monkeypatch):
    # A schema job on openai-batch; its answers are chat completions as the SDK shapes them.
    job = loaded_job(store, clock, tmp_path, monkeypatch, ["ok-1", "bad-enum", "not-json"], response_schema=SCHEMA)
    first = {
        "ok-1": '{"label": "billing", "urgent": true}', "bad-enum": '{"label": "sales", "urgent": false}',
        "not-json": "billing, I think",
    }  # fmt: skip
    answer_all(store, job, {cid: chat(choice(0, text)) for cid, text in first.items()})
    assert sorted(pending(store)) == ["bad-enum", "not-json"]  # each gets its one repair
    answer_all(store, job, {cid: chat(choice(0, first[cid])) for cid in ("bad-enum", "not-json")})  # wrong again
    with store.begin() as conn:
        got = {r.custom_id: r for r in conn.execute(sa.select(*whole_columns(requests)))}
        tries = dict(
            conn.execute(
                sa.select(requests.c.custom_id, sa.func.count(attempts.c.id))
                .join(attempts, attempts.c.request_id == requests.c.id)
                .group_by(requests.c.custom_id)
            ).all()
        )
    assert {c: r.state for c, r in got.items()} == {"ok-1": "succeeded", "bad-enum": "failed", "not-json": "failed"}
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
