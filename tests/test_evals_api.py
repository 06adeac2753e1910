"""The notebook path of an eval: Job.from_dataframe(..., variants=...), run(), compare()."""

from __future__ import annotations

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
