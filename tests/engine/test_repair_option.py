"""The repair attempt (issue 33): optional (`repair: false` fails an invalid answer at once),
and its cost reported apart by `lowtide report` (and so the dashboard, which shows
`cost_report`'s figures)."""

from __future__ import annotations

import sqlalchemy as sa

from lowtide.engine.report import cost_report
from lowtide.store.schema import attempts, repair_sends, requests
from tests.cli.test_cli import Cli
from tests.conftest import whole_columns
from tests.engine.answers import answer_all, chat, choice, loaded_job, pending

SCHEMA = {"type": "object", "properties": {"label": {"enum": ["billing", "technical"]}}, "required": ["label"]}
GOOD, BAD = '{"label": "billing"}', '{"label": "sales"}'


def test_repair_false_fails_an_invalid_answer_at_once_with_the_validation_error(store, clock, tmp_path, monkeypatch):
    job = loaded_job(store, clock, tmp_path, monkeypatch, ["ok", "bad"], response_schema=SCHEMA, repair=False)
    answer_all(store, job, {"ok": chat(choice(0, GOOD)), "bad": chat(choice(0, BAD))})
    assert pending(store) == []
    with store.begin() as conn:
        got = {r.custom_id: r for r in conn.execute(sa.select(*whole_columns(requests)))}
        tries = conn.execute(sa.select(sa.func.count()).select_from(attempts)).scalar_one()
    assert got["ok"].state == "succeeded" and got["bad"].state == "failed" and tries == 2
    assert got["bad"].error_code == "invalid_output" and got["bad"].repair is None
    assert got["bad"].error_message.startswith("answer invalid (repair: false, not retried): does not match the schema at label: 'sales'")


def test_repair_attempts_and_their_cost_are_reported_apart(store, clock, tmp_path, monkeypatch):
    job = loaded_job(store, clock, tmp_path, monkeypatch, ["ok", "mended", "hopeless"], response_schema=SCHEMA, model="gpt-4o-mini")
    answer_all(store, job, {"ok": chat(choice(0, GOOD)), "mended": chat(choice(0, BAD)), "hopeless": chat(choice(0, BAD))})
    assert sorted(pending(store)) == ["hopeless", "mended"]
    answer_all(store, job, {"mended": chat(choice(0, GOOD)), "hopeless": chat(choice(0, BAD))})  # the repair attempts
    with store.begin() as conn:
        states = dict(conn.execute(sa.select(requests.c.custom_id, requests.c.state)).all())
        marked = conn.execute(sa.select(sa.func.count()).select_from(repair_sends)).scalar_one()
        costs = conn.execute(sa.select(attempts.c.cost_picousd)).scalars().all()
    assert states == {"ok": "succeeded", "mended": "succeeded", "hopeless": "failed"} and marked == 2
    total = cost_report(store, job="tickets").total
    each = costs[0]
    assert each and set(costs) == {each}  # every answer has the same usage: one price
    assert total.attempts == 5 and total.repairs == 2 and total.repair_picousd == 2 * each
    assert total.cost_picousd == 5 * each  # the repairs are in the cost too, counted apart
    as_json = total.as_dict()
    assert as_json["repair_attempts"] == 2 and as_json["repair_usd"] == str(total.repair_usd)

    if store.is_sqlite:  # the command itself, on the same store file
        code, said = Cli(tmp_path, str(tmp_path / "lowtide.db"))("report", "--job", "tickets")
        assert code == 0, said
        assert "repair: 2 attempt(s) asked again after an invalid answer, costing $" in " ".join(said.split())


def test_no_repair_line_without_repairs(store, clock, tmp_path, monkeypatch):
    job = loaded_job(store, clock, tmp_path, monkeypatch, ["ok"], response_schema=SCHEMA, model="gpt-4o-mini")
    answer_all(store, job, {"ok": chat(choice(0, GOOD))})
    total = cost_report(store, job="tickets").total
    assert total.repairs == 0 and total.repair_picousd == 0 and total.attempts == 1
