"""The dashboard's eval view (server/dashboard_evals.py) over an eval whose provider variant
ran through openai-batch against this very `lowtide serve` (echo backend) and whose other
variant ran on echo: its JSON is `compare`'s report, its page shows every variant's row and
one chart point per variant, and with keys it needs one."""

from __future__ import annotations

import asyncio
import json

import httpx

from lowtide.core.clock import SystemClock
from lowtide.core.evals import build_eval
from lowtide.engine.compare import compare
from lowtide.engine.evals import load_eval, run_eval
from lowtide.engine.tick import Engine
from tests.conftest import ticket_rows, write_csv


def eval_spec(source, base_url: str) -> dict:
    return {
        "name": "dash-ev",
        "source": {"path": str(source), "id_column": "ticket_id"},
        "template": {"system": "Sort the ticket.", "user": "Ticket: {{ body }}"},
        # A schema, not choices: the provider is told only what its body says.
        "response_schema": {"type": "object", "properties": {"category": {"enum": ["billing", "technical", "account", "shipping", "feedback"]}},
                            "required": ["category"], "additionalProperties": False},
        "params": {"max_tokens": 8},
        "variants": {"models": [
            {"name": "mini", "model": "gpt-4o-mini", "route": "openai-batch", "route_options": {"base_url": base_url}},
            {"name": "echo", "model": "echo-model", "route": "echo"},
        ]},
        "scoring": {"method": "json_fields", "fields": {"category": "gold"}},
    }  # fmt: skip


def test_the_eval_page_and_json_show_compares_report(serve, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    rows = ticket_rows(12)
    rows[0]["gold"] = ""
    source = write_csv(tmp_path / "t.csv", rows)
    with serve() as s:
        store = s.server.store
        ev = build_eval(eval_spec(source, f"{s.url}/v1"))
        load_eval(store, ev, SystemClock())

        async def go():
            async with Engine(store) as engine:
                return await run_eval(engine, ev, SystemClock())

        statuses = asyncio.run(go())
        assert [st.counts for st in statuses] == [{"succeeded": 12}, {"succeeded": 12}], [st.failures for st in statuses]
        report = compare(store, ev).to_dict()
        mini = report["variants"][0]
        assert (mini["route"], mini["scored"], mini["not_scored"]) == ("openai-batch", 11, {"no expected value": 1})
        assert mini["turnaround_p50_s"] is not None
        # A JSON answer reads as its JSON among the rows where variants disagree (not a
        # normalised text with its braces and quotes stripped).
        assert report["disagreements"], report
        assert all(isinstance(json.loads(a), dict) for row in report["disagreements"] for a in row["answers"].values())
        got = httpx.get(f"{s.url}/dashboard/api/evals/dash-ev").json()
        assert got == httpx.get(f"{s.url}/dashboard/api/evals/dash-ev").json()
        assert [v["variant"] for v in got["variants"]] == ["mini", "echo"]
        assert {k: got["variants"][0][k] for k in ("scored", "correct", "accuracy", "ci_low", "ci_high")} == {
            k: mini[k] for k in ("scored", "correct", "accuracy", "ci_low", "ci_high")
        }
        page = httpx.get(f"{s.url}/dashboard/evals/dash-ev")
        assert page.status_code == 200
        assert page.text.count('<tr data-variant="') == 2 and page.text.count('class="point"') == 2
        assert "McNemar" in page.text and "mini" in page.text
        assert 'href="/dashboard/evals/dash-ev"' in httpx.get(f"{s.url}/dashboard/evals").text
        assert 'href="/dashboard/evals"' in httpx.get(f"{s.url}/dashboard").text  # reached from the dashboard
        assert httpx.get(f"{s.url}/dashboard/api/evals/nope").status_code == 404


def test_with_keys_the_eval_view_needs_one(serve):
    with serve(api_keys=("sekret",)) as s:
        for path in ("/dashboard/evals", "/dashboard/evals/x", "/dashboard/api/evals/x"):
            assert httpx.get(f"{s.url}{path}").status_code == 401, path
        assert httpx.get(f"{s.url}/dashboard/evals", headers={"x-api-key": "sekret"}).status_code == 200
