"""lowtide inside the orchestrators data teams run (Airflow, Dagster), each behind its own
extra: `pip install lowtide` pulls none of them, and a module here imported without its
extra (or with a release outside the supported range) fails with lowtide's message naming
the extra and the pip command (`require`)."""

from __future__ import annotations

import importlib
import re
from typing import Literal

from lowtide.core.errors import InputError


class MissingExtra(InputError, ImportError):
    """An integration's package is not installed, or is a release lowtide does not support."""


def require(module: str, extra: str, minimum: tuple[int, ...] = (), below: tuple[int, ...] | None = None) -> None:
    """Import `module` (the orchestrator's package) or raise MissingExtra with the fix: the
    extra to install, and the supported range where the installed release is outside it."""
    fix = f"pip install 'lowtide[{extra}]'"
    try:
        package = importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f"lowtide.integrations.{extra} needs the {extra!r} extra: {fix}") from None
    found = getattr(package, "__version__", "0")
    release = tuple(int(n) for n in re.findall(r"\d+", found)[: max(len(minimum), len(below or ()), 1)])
    if release < minimum or (below is not None and release >= below):
        supported = ".".join(map(str, minimum)) + (f" to below {'.'.join(map(str, below))}" if below else " or later")
        raise MissingExtra(f"lowtide.integrations.{extra} supports {module} {supported}; {found} is installed: {fix}")


# What fails the orchestrator's task or materialisation, by the job's outcome.
FailOn = Literal["any_failed", "all_failed", "never"]
FAIL_ON = ("any_failed", "all_failed", "never")


def job_failure(job: str, state: str, counts: dict[str, int], fail_on: FailOn, again: str = "run the task again") -> str | None:
    """Why a job's end fails the task under `fail_on`, or None: `any_failed`, a request
    failed or was cancelled; `all_failed`, none succeeded; `never`. A job that stopped on its
    budget with requests not sent fails under both (its results are partial)."""
    bad = counts.get("failed", 0) + counts.get("cancelled", 0)
    unsent = sum(counts.values()) - bad - counts.get("succeeded", 0)
    if fail_on != "never" and state == "budget_exhausted" and unsent:
        return f"job {job!r}: its budget_usd is spent with {unsent} request(s) not sent ({counted(counts)}); raise budget_usd in the spec and {again}"
    if fail_on == "any_failed" and bad:
        return f"job {job!r}: {bad} request(s) failed or were cancelled ({counted(counts)}); see `lowtide status {job}`, and `lowtide retry {job}` then {again}"
    if fail_on == "all_failed" and sum(counts.values()) and not counts.get("succeeded"):
        return f"job {job!r}: no request succeeded ({counted(counts)}); see `lowtide status {job}`"
    return None


def counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no requests"
