"""End to end: a job on each provider batch route against a real `lowtide serve` (echo
backend), exported with the provider's own answers: the answer columns and the whole
response come from what the official SDK received, matched by custom_id."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from lowtide.core.clock import ManualClock
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.store.db import Store
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import ROUTES, _options, _run, serve  # noqa: F401  (serve: the fixture)

FINISH = {"openai-batch": "stop", "anthropic-batch": "end_turn"}


@pytest.mark.parametrize("route", ROUTES)
def test_a_batch_jobs_export_carries_the_providers_answers(route, serve, tmp_path):  # noqa: F811
    url = serve()
    source = write_csv(tmp_path / "t.csv", ticket_rows(6))
    store = Store(str(tmp_path / "client.db"))
    load_job(store, make_spec(source, route=route, route_options=_options(route, url)), ManualClock())
    assert _run(store, "tickets").counts == {"succeeded": 6}
    export_results(store, "tickets", tmp_path / "out.jsonl", full=True)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    for row in rows:
        body = row["response"]
        assert row["finish_reason"] == FINISH[route] and row["tool_calls"] is None and row["refusal"] is None
        if route == "openai-batch":
            assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == row["output"]
            assert row["input_tokens"] == body["usage"]["prompt_tokens"]
        else:
            assert body["type"] == "message" and body["content"][0]["text"] == row["output"]
            assert row["input_tokens"] == body["usage"]["input_tokens"]
        assert type(row["input_tokens"]) is int and row["output"] == f"Ticket: {row['body']}"
    export_results(store, "tickets", tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("finish_reason").to_pylist() == [FINISH[route]] * 6 and "response" not in table.column_names
