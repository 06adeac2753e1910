"""The notebook path of an eval: Job.from_dataframe(..., variants=...), run(), compare()."""

from __future__ import annotations

import asyncio

import pandas as pd

import lowtide
from lowtide.evals_api import Eval
from tests.conftest import ticket_rows


def test_an_eval_from_a_dataframe_runs_and_compares(tmp_path):
    df = pd.DataFrame(ticket_rows(20))
    ev = lowtide.Job.from_dataframe(
        df, name="nb-eval", id_column="ticket_id", user="{{ body }}", system="Sort it.",
        choices=["billing", "technical", "account", "shipping", "feedback"], params={"max_tokens": 8},
        variants={"models": [{"name": "e", "model": "echo-model", "route": "echo"}],
                  "prompts": [{"name": "right", "user": "Ticket: {{ body }}"}, {"name": "wrong", "user": "technical or {{ body }}?"}]},
        scoring={"method": "choice", "expected": "gold"},
        store=str(tmp_path / "s.db"), source_dir=tmp_path / "src",
    )  # fmt: skip
    assert isinstance(ev, Eval) and ev.jobs == ["nb-eval.e-right", "nb-eval.e-wrong"]
    statuses = ev.run()
    assert [s.counts for s in statuses] == [{"succeeded": 20}, {"succeeded": 20}]
    table = ev.compare()
    assert list(table["variant"]) == ["e-right", "e-wrong"]
    assert list(table["scored"]) == [20, 20] and list(table["accuracy"]) == [1.0, 0.2]
    assert {"ci_low", "ci_high", "cost_usd", "realtime_usd", "cost_per_correct", "turnaround_p95_s", "failed"} <= set(table.columns)
    assert ev.report().pairs[0].p_value < 0.001


def _small_eval(tmp_path, name: str) -> Eval:
    return lowtide.Job.from_dataframe(
        pd.DataFrame(ticket_rows(6)), name=name, id_column="ticket_id", user="Ticket: {{ body }}",
        choices=["billing", "technical", "account", "shipping", "feedback"], params={"max_tokens": 8},
        variants={"models": [{"name": "a", "model": "echo-model", "route": "echo"}, {"name": "b", "model": "echo-2", "route": "echo"}]},
        scoring={"method": "choice", "expected": "gold"}, store=str(tmp_path / "s.db"), source_dir=tmp_path / "src",
    )  # fmt: skip


def test_eval_run_works_inside_a_running_event_loop_and_run_async_on_it(tmp_path):
    # A Jupyter cell runs in an event loop: Eval.run() died there (asyncio.run in a running loop).
    async def cell() -> tuple[list, list]:
        blocking = _small_eval(tmp_path, "in-loop").run()
        awaited = await _small_eval(tmp_path, "awaited").run_async()
        return blocking, awaited

    blocking, awaited = asyncio.run(cell())
    assert [s.counts for s in blocking] == [{"succeeded": 6}] * 2
    assert [s.counts for s in awaited] == [{"succeeded": 6}] * 2
