"""`fail_on`, shared by the Airflow operator and the Dagster asset: a job that stopped on its
budget with requests unsent failed neither Airflow task (it returned partial results as a
success) nor, before the Dagster asset's own check, a materialisation."""

from __future__ import annotations

import pytest

from lowtide.integrations import job_failure

DONE = {"succeeded": 3}
SOME_FAILED = {"succeeded": 2, "failed": 1}
NONE_OK = {"failed": 2, "cancelled": 1}
SHORT = {"succeeded": 2, "pending": 5}  # the budget ran out with 5 not sent


@pytest.mark.parametrize(("state", "counts", "fail_on", "fails"), [
    ("finished", DONE, "any_failed", None),
    ("finished", SOME_FAILED, "any_failed", "1 request(s) failed or were cancelled (1 failed, 2 succeeded)"),
    ("finished", SOME_FAILED, "all_failed", None),
    ("finished", NONE_OK, "all_failed", "no request succeeded"),
    ("finished", NONE_OK, "never", None),
    ("budget_exhausted", SHORT, "any_failed", "budget_usd is spent with 5 request(s) not sent"),
    ("budget_exhausted", SHORT, "all_failed", "budget_usd is spent with 5 request(s) not sent"),
    ("budget_exhausted", SHORT, "never", None),
])  # fmt: skip
def test_fail_on(state, counts, fail_on, fails):
    why = job_failure("tickets", state, counts, fail_on, again="clear the task")
    assert why is None if fails is None else fails in why
