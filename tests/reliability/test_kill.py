"""The kill test, short: bench/killtest.py's harness with fewer trials and rows. Real
`lowtide run` processes are SIGKILLed at seeded random moments and restarted; afterwards the
stores must show nothing lost, nothing duplicated, no chunk submitted twice, every job
converged. The long version is a command (docs/reliability.md).

Every wait in the harness is a safety net (a process that hangs), never a timing assumption:
where a kill lands changes from run to run, and every landing must give the same figures.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[2] / "bench" / "killtest.py"


def _harness():
    spec = importlib.util.spec_from_file_location("killtest", HARNESS)
    module = importlib.util.module_from_spec(spec)
    sys.modules["killtest"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["--route", "echo", "--trials", "10", "--rows", "2000", "--seed", "1"],
        ["--route", "openai-batch", "--trials", "3", "--rows", "400", "--chunk", "50", "--seed", "1"],
    ],
    ids=["echo", "openai-batch"],
)
def test_sigkill_at_random_moments_loses_and_repeats_nothing(argv):
    killtest = _harness()
    args = killtest.parser().parse_args([*argv, "--timeout", "300"])
    lines: list[str] = []
    summary = killtest.run_trials(args, echo=lines.append)
    figures = summary.to_json()
    assert len(summary.trials) == args.trials, lines
    assert figures["kills"] > 0, lines  # the harness did kill (a run can end before a kill's moment)
    worst = ("lost", "duplicated", "double_submitted", "not_converged", "crashes")
    assert [figures[k] for k in worst] == [0] * len(worst), (
        figures["failed_trials"],
        lines,
    )
    if args.route == "openai-batch":
        assert figures["provider_batches"] >= args.trials * (args.rows // args.chunk)


def _chaos_harness():
    _harness()  # bench/chaostest.py builds on the kill test's pieces
    spec = importlib.util.spec_from_file_location("chaostest", HARNESS.with_name("chaostest.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaostest"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.postgres
def test_three_workers_kills_cancels_appends_budget_and_spec_change_on_postgres(pg_schema_url):
    """bench/chaostest.py, short: three workers on one PostgreSQL job, SIGKILLed at random,
    while the job is cancelled and retried, rows are appended, the budget binds and is raised,
    and a spec with another model is submitted under the same name."""
    chaostest = _chaos_harness()
    base = pg_schema_url.split("?", 1)[0]  # each trial makes its own schema in this database
    args = chaostest.parser().parse_args(["--trials", "2", "--rows", "200", "--append", "20", "--chunk", "40",
                                          "--seed", "1", "--db", base, "--timeout", "300"])  # fmt: skip
    lines: list[str] = []
    summary = chaostest.run_trials(args, echo=lines.append)
    figures = summary.to_json()
    assert figures["trials_run"] == args.trials, lines
    assert figures["kills"] > 0 and figures["cancels"] > 0 and figures["appended"] > 0, lines
    worst = ("lost", "duplicated", "double_submitted", "double_billed", "not_converged", "crashes")
    assert [figures[k] for k in worst] == [0] * len(worst), (figures["failed_trials"], lines)
