"""Commands about one job: run, submit, status, results, cancel, retry."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
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
)
from lowtide.cli.display import (
    done_count,
    job_progress,
    money,
    placement_table,
    progress_detail,
    status_table,
)
from lowtide.core.clock import SystemClock
from lowtide.core.errors import LowtideError
from lowtide.core.evals import is_eval_file
from lowtide.core.spec import JobSpec, load_spec
from lowtide.core.states import JobState
from lowtide.engine.control import JobStatus, cancel_job, job_spec, job_status, retry_job
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.queries import list_jobs

SpecPath = Annotated[Path, typer.Argument(help="The job spec (YAML).", show_default=False)]
JobName = Annotated[str, typer.Argument(help="The job's name (the `name:` of its spec).", show_default=False)]


RequeueChanged = Annotated[
    bool,
    typer.Option(
        "--requeue-changed",
        help="Re-render and queue again the stored requests that the spec or the source rows now "
        "render differently (docs/jobs.md 'Changing a job'); without it a spec change that alters "
        "requests is refused and changed rows are kept.",
    ),
]


def _load(store: Store, spec_path: Path, requeue_changed: bool = False) -> JobSpec:
    spec = load_spec(spec_path)
    with job_progress() as progress:
        task = progress.add_task(f"render {spec.name}", total=None, detail="")
        report = load_job(
            store, spec, SystemClock(), str(spec_path), on_rows=lambda n: progress.update(task, completed=n),
            requeue_changed=requeue_changed,
        )  # fmt: skip
        progress.update(task, total=report.rows, completed=report.rows, detail=f"{report.new} new, {report.known} already stored")
    for change in report.applied:
        console.print(f"spec change applied: {change}", markup=False)
    if line := report.changed_line():
        console.print(line, markup=False)
    return spec


def run(
    spec_path: SpecPath,
    out_path: Annotated[Path | None, typer.Option("--out", help="Write results here (default: the spec's output.path).")] = None,
    requeue_changed: RequeueChanged = False,
) -> None:
    """Submit a job and drive it to completion, then write its results.

    Ctrl-C stops at once and leaves the job resumable: run the same command again.

    An eval spec (one with `variants:`, docs/evals.md) runs every variant and prints the report.

    Example: lowtide run examples/classify-tickets.yaml
    """
    if is_eval_file(spec_path):
        from lowtide.cli import evals

        return evals.run(spec_path, requeue_changed)
    try:
        with open_store() as store:
            spec = _load(store, spec_path, requeue_changed)
            status = _drive(store, spec.name)
            target = out_path or (spec.resolve(spec.output.path) if spec.output else None)
            if target is not None:
                report = export_results(store, spec.name, target)
                console.print(f"results: {report.path} ({report.rows} rows)")
    except KeyboardInterrupt:
        console.print("interrupted: the job is resumable; run the same command again to continue")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except LowtideError as err:
        raise fail(err) from None
    out.print(status_table([status]))
    if status.state == JobState.BUDGET_EXHAUSTED:
        _print_budget(status)
    raise typer.Exit(EXIT_OK if status.all_succeeded else EXIT_FAILURES)


def _drive(store: Store, name: str) -> JobStatus:
    async def go() -> JobStatus:
        with job_progress() as progress:
            task = progress.add_task(f"run {name}", total=None, detail="")

            def on_tick(status: JobStatus, _report) -> None:
                progress.update(task, total=status.total, completed=done_count(status), detail=progress_detail(status))

            async with Engine(store) as engine:
                return await drive(engine, name, on_tick)

    return asyncio.run(go())


def submit(spec_path: SpecPath, requeue_changed: RequeueChanged = False) -> None:
    """Check a job and store its requests, without running anything (a worker or `tick` will).

    Submitting the same spec again adds only rows not stored yet.

    Example: lowtide submit examples/classify-tickets.yaml && lowtide worker --until-idle
    """
    try:
        with open_store() as store:
            spec = _load(store, spec_path, requeue_changed)
            console.print(f'job "{spec.name}" stored in {store.describe()}')
    except LowtideError as err:
        raise fail(err) from None


def status(
    job: Annotated[str | None, typer.Argument(help="A job name; all jobs when left out.", show_default=False)] = None,
) -> None:
    """Show how far jobs are: requests by state, live batches by provider phase, recent events.

    Example: lowtide status classify-tickets
    """
    try:
        with open_store() as store:
            if job is None:
                with store.begin() as conn:
                    names = [r.name for r in list_jobs(conn)]
                out.print(status_table([job_status(store, n) for n in names]))
                return
            s = job_status(store, job)
    except LowtideError as err:
        raise fail(err) from None
    out.print(status_table([s]))
    if len(s.placement) > 1 or any(why for _, why, _, _ in s.placement):
        out.print(placement_table(s))
    if s.failures:
        out.print("failures: " + ", ".join(f"{code} × {n}" for code, n in sorted(s.failures.items())))
    out.print(f"tokens: {s.tokens.get('input_tokens', 0)} in, {s.tokens.get('output_tokens', 0)} out over {s.tokens.get('attempts', 0)} attempts")
    _print_budget(s)
    for event in s.events:
        out.print(f"  {event}", markup=False)


def _print_budget(s: JobStatus) -> None:
    """Spent against the budget; how to go on when it ran out."""
    if s.unknown_costs:
        out.print(f"cost unknown for {s.unknown_costs} attempt(s): see `lowtide report --job {s.name}`", markup=False)
    if s.budget_usd is None:
        return
    line = f"budget: {money(s.spent_usd)} spent, {money(s.reserved_usd)} reserved of {money(s.budget_usd)}"
    if s.state == JobState.BUDGET_EXHAUSTED:
        line += "; exhausted: raise budget_usd in the spec and run `lowtide submit` with it to resume"
    out.print(line, markup=False)


def results(
    job: JobName,
    out_path: Annotated[Path, typer.Option("--out", "-o", help="File to write: .csv, .jsonl or .parquet.")],
    compare: Annotated[
        str | None, typer.Option(help="A source column holding the expected answer: print the accuracy.")
    ] = None,
    full: Annotated[
        bool, typer.Option("--full", help="Add a `response` column: each provider's whole answer body, as it came.")
    ] = False,
) -> None:
    """Write a job's results joined to its source rows by custom_id.

    Example: lowtide results classify-tickets --out results.parquet --compare gold
    """
    try:
        with open_store() as store:
            report = export_results(store, job, out_path, full=full)
            spec = job_spec(store, job)
    except LowtideError as err:
        raise fail(err) from None
    console.print(f"wrote {report.rows} rows to {report.path} ({', '.join(f'{n} {s}' for s, n in sorted(report.states.items()))})")
    if compare:
        _print_accuracy(report.path, compare, spec)


def _print_accuracy(path: Path, column: str, spec: JobSpec) -> None:
    """Share of rows whose answer equals the expected column, per expected value."""
    from lowtide.core.sources import Source

    source = Source(path)
    per: dict[str, list[int]] = {}
    for chunk in source.chunks():
        columns = source.columns or list(chunk[0].values)
        if column not in columns:
            console.print(f'lowtide: --compare: no column "{column}" in the results; columns are: {", ".join(columns)}')
            raise typer.Exit(EXIT_USAGE)
        answer_col = "lowtide_output" if "lowtide_output" in columns else "output"
        for row in chunk:
            gold = str(row.values.get(column, "")).strip()
            got = str(row.values.get(answer_col) or "").strip()
            hit = per.setdefault(gold, [0, 0])
            hit[0] += got.lower() == gold.lower()
            hit[1] += 1
    table = Table(title=f"accuracy against {column} ({spec.model} on {spec.route})")
    for col in ("expected", "rows", "correct", "accuracy"):
        table.add_column(col, justify="left" if col == "expected" else "right")
    for gold, (ok, n) in sorted(per.items()):
        table.add_row(gold, str(n), str(ok), f"{ok / n:.0%}")
    ok = sum(v[0] for v in per.values())
    n = sum(v[1] for v in per.values())
    table.add_row("[bold]all", str(n), str(ok), f"[bold]{ok / n:.1%}" if n else "-")
    if spec.effective_choices:
        table.caption = f"chance level with {len(spec.effective_choices)} choices: {1 / len(spec.effective_choices):.0%}"
    out.print(table)


def cancel(job: JobName) -> None:
    """Cancel a job: unsent requests are cancelled, provider batches asked to stop.

    Results a provider had already produced are still brought in (they are paid for).

    Example: lowtide cancel classify-tickets
    """
    try:
        with open_store() as store:
            was = job_status(store, job, events=0).state
            n = cancel_job(store, job, SystemClock())
            now = job_status(store, job, events=0)
    except LowtideError as err:
        raise fail(err) from None
    in_flight = sum(now.phases.values())
    if was == now.state:  # finished, or cancelled already
        console.print(f"nothing to cancel: {job} is {now.state}")
        return
    # Every request may be in a batch already sent: the job is cancelled all the same.
    flight = f"; {in_flight} batch(es) in flight asked to stop" if in_flight else ""
    console.print(f"cancelled {job}: {n} unsent request(s) cancelled{flight}")
    if in_flight:
        console.print("run `lowtide tick` or a worker to collect what those batches finished (it is paid for)")


def retry(
    job: JobName,
    failed: Annotated[bool, typer.Option("--failed", help="Retry the requests that failed.")] = False,
    cancelled: Annotated[bool, typer.Option("--cancelled", help="Retry the requests that were cancelled.")] = False,
) -> None:
    """Queue failed (or cancelled) requests again with a fresh attempt budget.

    Example: lowtide retry classify-tickets --failed && lowtide worker --until-idle
    """
    if not (failed or cancelled):
        console.print("lowtide: say what to retry: --failed, --cancelled, or both")
        raise typer.Exit(EXIT_USAGE)
    try:
        with open_store() as store:
            n = retry_job(store, job, SystemClock(), failed=failed, cancelled=cancelled)
    except LowtideError as err:
        raise fail(err) from None
    console.print(f"queued {n} request(s) of {job} again")
