"""Evals: `lowtide run` of an eval spec (variants:), and `lowtide compare EVAL`.

What only a run needs (the engine, the progress display) is imported by `run`: `lowtide
compare` reads and scores, and pays for nothing else."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from lowtide.cli.common import (
    EXIT_FAILURES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    console,
    fail,
    open_store,
    out,
    say_error,
)
from lowtide.cli.tables import Col, fitted_table
from lowtide.core.errors import LowtideError
from lowtide.engine.compare import EvalReport, compare, variant_rows
from lowtide.engine.evals import stored_eval


def run(spec_path: Path, requeue_changed: bool = False) -> None:
    """`lowtide run` of an eval spec: load every variant, run them together, print the report."""
    from lowtide.cli.display import status_table
    from lowtide.core.clock import SystemClock
    from lowtide.core.evals import load_eval
    from lowtide.engine.evals import load_eval as load_eval_jobs

    try:
        with open_store() as store:
            ev = load_eval(spec_path)

            def said(variant: str, report) -> None:
                console.print(f"variant {variant}: {report.rows} rows, {report.new} new, {report.known} already stored", markup=False)
                if line := report.changed_line():
                    console.print(f"  {line}", markup=False)

            load_eval_jobs(store, ev, SystemClock(), said, requeue_changed)
            statuses = _drive(store, ev, requeue_changed)
            report = compare(store, ev)
    except KeyboardInterrupt:
        console.print("interrupted: the eval is resumable; run the same command again to continue")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except LowtideError as err:
        raise fail(err) from None
    out.print(status_table(statuses, out))
    print_report(report)
    raise typer.Exit(EXIT_OK if all(s.all_succeeded for s in statuses) else EXIT_FAILURES)


def _drive(store, ev, requeue_changed: bool):
    from lowtide.cli.display import done_count, job_progress
    from lowtide.core.clock import SystemClock
    from lowtide.engine.evals import run_eval
    from lowtide.engine.tick import Engine

    async def go():
        with job_progress() as progress:
            tasks = {}

            def on_tick(statuses) -> None:
                for s in statuses:
                    if s.name not in tasks:
                        tasks[s.name] = progress.add_task(f"run {s.name}", total=None, detail="")
                    progress.update(tasks[s.name], total=s.total, completed=done_count(s))

            async with Engine(store) as engine:
                # --requeue-changed reaches the judge too: a verdict on a re-run answer is judged again.
                return await run_eval(engine, ev, SystemClock(), on_tick, requeue_changed=requeue_changed)

    return asyncio.run(go())


def compare_command(
    name: Annotated[str, typer.Argument(help="The eval's name (the `name:` of its spec).", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole report as JSON.")] = False,
    out_path: Annotated[Path | None, typer.Option("--out", "-o", help="Also write the per-variant table: .csv or .parquet.")] = None,
    rows: Annotated[int, typer.Option("--rows", help="How many disagreeing rows to show.")] = 10,
) -> None:
    """Compare an eval's variants: accuracy with 95 % bootstrap intervals, failures, cost, cost per
    correct answer, tokens, turnaround, paired McNemar tests, confusion matrices, disagreements.

    Example: lowtide compare eval-tickets --out report.parquet
    """
    try:
        with open_store() as store:
            report = compare(store, stored_eval(store, name), disagreements=rows)
    except LowtideError as err:
        raise fail(err) from None
    if out_path is not None:
        try:
            write_table(report, out_path)
        except ValueError as err:
            say_error(f"--out: {err}")
            raise typer.Exit(EXIT_USAGE) from None
        console.print(f"wrote {len(report.variants)} variant rows to {out_path}")
    if as_json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print_report(report)


def write_table(report: EvalReport, path: Path) -> None:
    import pyarrow as pa

    table = pa.Table.from_pylist(variant_rows(report))
    suffix = path.suffix.lower()
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif suffix == ".csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, path)
    else:
        raise ValueError(f'"{path.suffix}" is not a table format; use .csv or .parquet')


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _usd(x: float | None) -> str:
    if x is None:
        return "-"
    if 0 < x < 0.0001:  # a cost per correct answer is often a fraction of a cent: never "$0.0000"
        return f"${x:.2g}" if x < 1e-6 else f"${x:.6f}".rstrip("0")
    return f"${x:,.4f}" if x < 100 else f"${x:,.2f}"


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}s" if x < 120 else f"{x / 60:.1f}m"


# The per-variant table: at 80 columns the least useful figures are left out first (named
# under the table, all in --json); accuracy, its interval and cost are always shown.
VARIANT_COLS = [
    Col("variant"), Col("model", drop=5), Col("route", drop=6), Col("scored", figure=True), Col("accuracy", figure=True),
    Col("95% CI", figure=True), Col("not scored", figure=True, drop=2), Col("failed", figure=True),
    Col("cost", figure=True), Col("real-time", figure=True, drop=4), Col("$/correct", figure=True, drop=1),
    Col("tokens in/out", figure=True, drop=7), Col("p50", figure=True, drop=8), Col("p95", figure=True, drop=9),
]  # fmt: skip
PAIR_COLS = [Col("A"), Col("B"), Col("n", figure=True), Col("A only right", figure=True, drop=2),
             Col("B only right", figure=True, drop=2), Col("A − B", figure=True), Col("95% CI", figure=True),
             Col("p", figure=True)]  # fmt: skip


def print_report(report: EvalReport) -> None:
    rows = [
        [
            v.variant, v.model, v.route, f"{v.scored:,}", _pct(v.accuracy),
            "-" if v.ci_low is None else f"{_pct(v.ci_low)}–{_pct(v.ci_high)}",
            ", ".join(f"{n:,} {r}" for r, n in v.not_scored.items()) or "0",
            ", ".join(f"{n:,} {r}" for r, n in v.failures.items()) or "0",
            _usd(v.cost_usd), _usd(v.realtime_usd), _usd(v.cost_per_correct),
            f"{v.input_tokens:,}/{v.output_tokens:,}", _secs(v.turnaround_p50_s), _secs(v.turnaround_p95_s),
        ]  # fmt: skip
        for v in report.variants
    ]
    title = f"eval {report.name}" + (f" (scoring: {report.method})" if report.method else "")
    out.print(fitted_table(out, VARIANT_COLS, [[escape(c) for c in r] for r in rows], title=title))
    for v in report.variants:
        if v.field_accuracy:
            out.print(f"{v.variant} per field: " + ", ".join(f"{p} {_pct(a)}" for p, a in v.field_accuracy.items()), markup=False)
    if report.pairs:
        pairs = []
        for pr in report.pairs:
            diff = "-" if pr.difference is None else f"{100 * pr.difference:+.1f} pt"
            ci = "-" if pr.ci_low is None else f"{100 * pr.ci_low:+.1f}…{100 * pr.ci_high:+.1f}"  # one word: never split
            pairs.append([escape(pr.a), escape(pr.b), f"{pr.n:,}", f"{pr.a_only:,}", f"{pr.b_only:,}", diff, ci, "-" if pr.p_value is None else f"{pr.p_value:.3g}"])
        out.print(fitted_table(out, PAIR_COLS, pairs, title="pairwise (rows both scored; McNemar exact test)"))
    for variant, matrix in report.confusion.items():
        labels = sorted({*matrix, *(g for row in matrix.values() for g in row)})
        c = Table(title=f"confusion: {variant} (rows: expected, columns: answer)")
        c.add_column("expected")
        for label in labels:
            c.add_column(label, justify="right")
        for want in sorted(matrix):
            c.add_row(want, *(str(matrix[want].get(g, 0) or "") for g in labels))
        out.print(c)
    if report.judge:
        j = report.judge
        out.print(f"judge {j['job']}: " + ("not run" if not j.get("run") else f"{j['model']} on {j['route']}, {j['states']}, cost {_usd(j['cost_usd'])}"), markup=False)
    if report.disagreements:
        out.print(f"{report.disagreeing_rows} row(s) where the variants disagree; the first {len(report.disagreements)}:", markup=False)
        for row in report.disagreements:
            answers = "  ".join(f"{n}={a[:40]!r}{'✓' if row['correct'].get(n) else '✗' if row['correct'].get(n) is False else ''}" for n, a in row["answers"].items())
            exp = f" expected={row['expected']!r}" if "expected" in row else ""
            out.print(f"  {row['key']}{exp}: {answers}", markup=False)
