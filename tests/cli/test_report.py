"""`lowtide report` and the cost in `lowtide status`: the real command, run as a subprocess
against a store whose ledger the engine's own ingest filled (tests/engine/ledger_helpers.py)."""

from __future__ import annotations

import json

from tests.cli.test_cli import Cli, status_row
from tests.engine.ledger_helpers import dispatch, ingest, ok, stored_job


def _ledger(store, tmp_path) -> None:
    job = stored_job(store, tmp_path, n=2, model="gpt-4o-mini", route="openai-batch", tags=["support"], budget_usd="0.01")
    d = dispatch(store, job, "openai-batch", ["r0", "r1"])
    ingest(store, job, d, "openai-batch", [
        ok("r0", input_tokens=1000, cached_input_tokens=400, output_tokens=200),  # 120 per M; real time 240
        ok("r1", input_tokens=2000, output_tokens=100),  # 180 per M; real time 360
    ])  # fmt: skip
    unknown = stored_job(store, tmp_path, name="eval", n=1, model="gpt-9-turbo", route="openai-batch")
    ingest(store, unknown, dispatch(store, unknown, "openai-batch", ["r0"]), "openai-batch", [ok("r0", input_tokens=10)])


def test_report_json_by_route_and_the_unknown_cost_line(store, tmp_path):
    _ledger(store, tmp_path)
    cli = Cli(tmp_path, store.location)
    (code, out), (code_table, table), (code_status, status) = cli.many(
        ("report", "--json", "--by", "route"), ("report", "--by", "tag"), ("status", "tickets")
    )
    assert code == 0, out
    data = json.loads(out)
    assert (data["by"], data["currency"], [g["group"] for g in data["groups"]]) == ("route", "USD", ["openai-batch"])
    total = data["total"]
    assert {k: total[k] for k in ("cost_usd", "realtime_usd", "saving_usd", "saving_percent", "cache_hit_share")} == {
        "cost_usd": "0.0003", "realtime_usd": "0.0006", "saving_usd": "0.0003", "saving_percent": "50.0", "cache_hit_share": "0.1329",
    }  # 400 cached of 3010 input
    assert (total["attempts"], total["unknown_cost_attempts"], total["unknown_cost_models"]) == (3, 1, ["gpt-9-turbo"])
    assert (total["input_tokens"], total["cached_input_tokens"], total["output_tokens"]) == (3010, 400, 300)

    assert code_table == 0, table
    assert "cost unknown for 1 attempt(s) (models: gpt-9-turbo): not counted in cost or saving" in table
    assert "support" in table and "(no tag)" in table

    assert code_status == 0, status
    assert status_row(status)["spent"] == "$0.000300 / $0.0100"
    assert "budget: $0.000300 spent, $0 reserved of $0.0100" in status


def test_report_of_one_job_since_a_date_and_bad_input(store, tmp_path):
    _ledger(store, tmp_path)
    cli = Cli(tmp_path, store.location)
    (code, out), (code_late, late), (code_bad, bad), (code_nope, nope) = cli.many(
        ("report", "--job", "tickets", "--json"),
        ("report", "--since", "2100-01-01", "--json"),
        ("report", "--since", "yesterday"),
        ("report", "--job", "nope"),
    )
    assert code == 0, out
    assert json.loads(out)["total"]["attempts"] == 2 and json.loads(out)["total"]["unknown_cost_attempts"] == 0
    assert code_late == 0 and json.loads(late)["total"]["attempts"] == 0
    assert code_bad == 2 and "--since yesterday: not an ISO date or date-time" in bad
    assert code_nope == 2 and 'no job named "nope"' in nope
