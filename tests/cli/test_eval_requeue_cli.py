"""`lowtide run --requeue-changed` of an eval spec with a judge: an answer the member re-ran is
judged again, from the new answer (issue 27 item 5: the judge kept its verdict on the old one,
and compare showed it beside the new answer)."""

from __future__ import annotations

import json

import sqlalchemy as sa
import yaml
from typer.testing import CliRunner

from lowtide.cli import app
from lowtide.store.db import Store
from lowtide.store.payloads import payload_text
from lowtide.store.schema import jobs, requests
from tests.conftest import ticket_rows, write_csv


def test_run_requeue_changed_judges_the_re_run_answer_again(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWTIDE_DB", str(tmp_path / "s.db"))
    rows = ticket_rows(4)
    write_csv(tmp_path / "t.csv", rows)
    spec = {
        "name": "rj", "source": {"path": "t.csv", "id_column": "ticket_id"}, "template": {"system": "Sort it."},
        "choices": ["billing", "technical", "account", "shipping", "feedback"], "params": {"max_tokens": 8},
        "variants": {"models": [{"name": "e", "model": "echo-model", "route": "echo"}], "prompts": [{"name": "p", "user": "Ticket: {{ body }}"}]},
        "scoring": {"method": "judge"},
        "judge": {"model": "judge-model", "route": "echo", "params": {"max_tokens": 64}, "user": "Was {{ output }} right for {{ body }}?"},
    }  # fmt: skip
    (tmp_path / "ev.yaml").write_text(yaml.safe_dump(spec))
    runner = CliRunner()
    assert (ran := runner.invoke(app, ["run", str(tmp_path / "ev.yaml")])).exit_code == 0, ran.output
    rows[0]["body"] = "ticket 1000 about shipping"  # was billing
    write_csv(tmp_path / "t.csv", rows)
    ran = runner.invoke(app, ["run", "--requeue-changed", str(tmp_path / "ev.yaml")])
    assert ran.exit_code == 0, ran.output
    store = Store(str(tmp_path / "s.db"))
    try:
        with store.begin() as conn:
            q = sa.select(payload_text().label("payload"), requests.c.version, requests.c.state).join(jobs)
            payload, version, state = conn.execute(q.where(jobs.c.name == "rj.judge", requests.c.source_key == "T1000__e-p")).one()
    finally:
        store.close()
    assert (json.loads(payload)["body"]["messages"][-1]["content"], version, state) == ("Was shipping right for ticket 1000 about shipping?", 2, "succeeded")
    report = json.loads(runner.invoke(app, ["compare", "rj", "--json"]).stdout)
    assert [(v["scored"], v["not_scored"]) for v in report["variants"]] == [(4, {})]
