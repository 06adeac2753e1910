"""`lowtide report`: what jobs cost, what the same tokens would have cost in real time, and
the saving, from the ledger of attempts."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

import typer
from rich.markup import escape as markup_escape

from lowtide.cli.common import EXIT_USAGE, fail, open_store, out, say_error
from lowtide.cli.display import money
from lowtide.cli.tables import Col, fitted_table
from lowtide.core.errors import LowtideError
from lowtide.engine.report import CostReport, Figures, cost_report


class By(StrEnum):
    route = "route"
    model = "model"
    tag = "tag"
    job = "job"


def report(
    job: Annotated[str | None, typer.Option("--job", help="Only this job.")] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Only attempts from this time on: an ISO date or date-time (UTC unless it has an offset)."),
    ] = None,
    by: Annotated[By | None, typer.Option("--by", help="One line per route, model, tag (of the job spec's `tags`) or job.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON (amounts as decimal strings).")] = False,
) -> None:
    """Report tokens, cost, real-time equivalent, savings, cache hits and failures.

    Costs come from the providers' own usage figures at the tier each attempt used. An
    attempt whose cost is unknown (a model without a price) is counted apart, never as $0.

    Example: lowtide report --by route --since 2025-11-01
    """
    start = None
    if since is not None:
        try:
            when = datetime.fromisoformat(since)
        except ValueError:
            say_error(f"--since {since}: not an ISO date or date-time; e.g. 2025-11-01 or 2025-11-01T08:00:00+01:00")
            raise typer.Exit(EXIT_USAGE) from None
        start = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    try:
        with open_store(create=False) as store:
            result = cost_report(store, job=job, since=start, by=by.value if by else None)
    except LowtideError as err:
        raise fail(err) from None
    if as_json:
        print(json.dumps(result.as_dict(), indent=2))
        return
    _print(result)


def _row(f: Figures) -> list[str]:
    cost = money(f.usd) + (f" + {f.unknown:,} unknown" if f.unknown else "")
    pct = "-" if f.saving_percent is None else f"{f.saving_percent}%"
    share = "-" if f.cache_hit_share is None else f"{f.cache_hit_share * 100:.1f}%"
    failures = f"{f.failures:,}" + (f" ({f.billed_failures:,} billed)" if f.billed_failures else "")
    stale = f"{f.stale:,}" + (f" ({money(f.stale_usd)})" if f.stale else "")
    return [
        f"{f.input_tokens:,}", f"{f.cached_input_tokens:,}", f"{f.cache_write_tokens:,}", f"{f.output_tokens:,}",
        cost, money(f.realtime_usd), f"{money(f.saving_usd)} ({pct})", share, f"{f.attempts:,}", failures, stale,
    ]  # fmt: skip


def _print(result: CostReport) -> None:
    scope = f"job {result.job}" if result.job else "all jobs"
    if result.since is not None:
        scope += f", since {datetime.fromtimestamp(result.since, UTC).isoformat(timespec='seconds')}"
    # Left out first when the width is short (every figure is in --json): the rarest reads.
    drops = {"cache writes": 9, "stale": 8, "cached": 7, "cache hits": 6, "tier": 5, "attempts": 4, "real time": 3, "failures": 2}
    names = ["input", "cached", "cache writes", "output", "cost", "real time", "saving", "cache hits", "attempts", "failures", "stale"]
    cols = ([Col(result.by), Col("tier", drop=drops["tier"])] if result.by else []) + [
        Col(n, figure=True, drop=drops.get(n, 0)) for n in names
    ]
    rows = [[markup_escape(g.group), ", ".join(sorted(g.tiers)) or "-", *_row(g)] for g in result.groups]
    rows.append(["[bold]total", "", *_row(result.total)] if result.by else _row(result.total))
    table = fitted_table(out, cols, rows, title=f"costs: {scope}" + (f", by {result.by}" if result.by else ""))
    out.print(table)
    total = result.total
    if total.unknown:
        models = ", ".join(sorted(total.unknown_models))
        out.print(f"cost unknown for {total.unknown} attempt(s) (models: {models}): not counted in cost or saving; "
                  "add their prices to a price file (docs/costs.md)", markup=False)  # fmt: skip
    if result.by == "tag":
        out.print("a job with several tags counts under each of them; the total counts it once", markup=False)
    if total.repairs:
        out.print(f"repair: {total.repairs} attempt(s) asked again after an invalid answer, costing {money(total.repair_usd)} "
                  "(in cost above); `repair: false` in the spec fails such answers at once instead", markup=False)  # fmt: skip
    if total.stale:
        out.print(f"stale: {total.stale} result(s) arrived after their request had moved on; paid for, so counted in cost", markup=False)
