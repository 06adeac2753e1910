"""Commands about one job: run, submit, status, results, cancel, retry."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape as markup_escape

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
from lowtide.cli.display import (
    job_progress,
    money,
    placement_table,
    status_json,
    status_table,
    tiers_table,
)
from lowtide.cli.tables import Col, fitted_table
from lowtide.cli.traces import TraceTo, check_trace_to, export_ended
from lowtide.core.clock import SystemClock
from lowtide.core.errors import InputError, JobNotFoundError, LowtideError, MissingStoreError
from lowtide.core.evals import is_eval_file
from lowtide.core.locations import scheme_of
from lowtide.core.output_target import output_target
from lowtide.core.spec import JobSpec, load_spec
from lowtide.core.states import JobState
from lowtide.engine.attention import attention
from lowtide.engine.control import JobStatus, cancel_job, job_spec, job_status, retry_job
from lowtide.engine.export import export_results, write_rows, write_target
from lowtide.engine.loader import load_job
from lowtide.engine.preflight import check_output, check_target
from lowtide.engine.progress import JobProgress
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.queries import list_jobs

SpecPath = Annotated[Path, typer.Argument(help="The job spec (YAML).", show_default=False)]
JobName = Annotated[str, typer.Argument(help="The job's name (the `name:` of its spec).", show_default=False)]
AsJson = Annotated[bool, typer.Option("--json", help="Print the outcome as JSON (shape: docs/cli.md).")]


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
    live = console.is_terminal and not console.is_dumb_terminal
    with job_progress(console, disable=not live) as progress:
        task = progress.add_task(f"render {spec.name}", total=None, detail="")
        report = load_job(
            store, spec, SystemClock(), str(spec_path), on_rows=lambda n: progress.update(task, completed=n),
            requeue_changed=requeue_changed,
        )  # fmt: skip
        detail = f"{report.new:,} new, {report.known:,} already stored"
        progress.update(task, total=report.rows, completed=report.rows, detail=detail)
    if not live:  # a pipe or a log: one plain line, never a cut-off bar
        console.print(f"stored {spec.name}: {report.rows:,} rows ({detail})", markup=False)
    for change in report.applied:
        console.print(f"spec change applied: {change}", markup=False)
    if line := report.changed_line():
        console.print(line, markup=False)
    if report.watermark is not None and spec.source.since is not None:  # what the next run reads past
        console.print(f"watermark: rows stored up to {spec.source.since.column} {report.watermark}", markup=False)
    return spec


def run(
    spec_path: SpecPath,
    out_path: Annotated[
        str | None, typer.Option("--out", help="Write results to this file or object-store URL (default: the spec's output).")
    ] = None,
    requeue_changed: RequeueChanged = False,
    as_json: AsJson = False,
    trace_to: TraceTo = None,
) -> None:
    """Submit a job and drive it to completion, then write its results.

    Ctrl-C stops at once and leaves the job resumable: run the same command again.

    An eval spec (one with `variants:`, docs/evals.md) runs every variant and prints the report.

    Example: lowtide run examples/classify-tickets.yaml
    """
    if is_eval_file(spec_path):
        from lowtide.cli import evals

        return evals.run(spec_path, requeue_changed)
    written = None
    check_trace_to(trace_to)
    try:
        spec = load_spec(spec_path)
        # --out: a file, the user's own choice; else the spec's output (a local path only inside
        # the spec's folder, an object-store URL, a partitioned folder or a SQL table).
        target = output_target(spec, out_path)
        if target is not None:  # before anything is paid for: a bad target fails now, not after the run
            check_target(spec, target)
        with open_store() as store:
            spec = _load(store, spec_path, requeue_changed)
            status = _drive(store, spec.name, placement=as_json)  # the table shows none
            if target is not None:
                written = write_target(store, spec.name, target)
                note = written.pruned_note()
                console.print(f"results: {written.path} ({written.rows} rows{f'; {note}' if note else ''})", markup=False)
            if trace_to is not None:
                export_ended(store, [spec.name], trace_to)
    except KeyboardInterrupt:
        console.print("interrupted: the job is resumable; run the same command again to continue")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except LowtideError as err:
        raise fail(err) from None
    if as_json:
        results = None if written is None else {"path": str(written.path), "rows": written.rows, "states": dict(sorted(written.states.items()))}
        shape = status_json(status) | {"results": results}
        print(json.dumps(shape, indent=2))
    else:
        out.print(status_table([status], out))
        if status.state == JobState.BUDGET_EXHAUSTED:
            _print_budget(status)
    raise typer.Exit(EXIT_OK if status.all_succeeded else EXIT_FAILURES)


def _drive(store: Store, name: str, placement: bool) -> JobStatus:
    async def go() -> JobStatus:
        with JobProgress(console, f"run {name}") as progress:
            async with Engine(store) as engine:
                # Counts read cheaply once a second (engine/progress.py), not the whole status per tick.
                return await progress.watch(drive(engine, name, placement=placement), store, name)

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
    as_json: AsJson = False,
) -> None:
    """Show how far jobs are: requests by state, live batches by provider phase, recent events,
    and what waits on you (a batch held for a refused key, results about to expire at the provider).

    Example: lowtide status classify-tickets
    """
    try:
        with open_store(create=False) as store:
            if job is None:
                with store.read() as conn:
                    names = [r.name for r in list_jobs(conn)]
                statuses = [job_status(store, n, placement=as_json) for n in names]  # the table shows none
                heeds = {n: attention(store, n, SystemClock()) for n in names}
                if as_json:
                    print(json.dumps({"jobs": [_with_attention(status_json(s), heeds[s.name]) for s in statuses]}, indent=2))
                else:
                    out.print(status_table(statuses, out) if statuses else "no jobs in this store yet")
                    for name, said in ((n, w) for n in names for w in heeds[n]):
                        out.print(f"{name}: {said}", markup=False, style="yellow")
                return
            s = job_status(store, job)
            heed = attention(store, job, SystemClock())
    except MissingStoreError as err:
        if job is None:  # nothing submitted here yet: the truthful answer is "no jobs"
            print(json.dumps({"jobs": []}) if as_json else f"no jobs yet ({str(err).split(':')[0]})")
            return
        raise fail(err) from None
    except LowtideError as err:
        raise fail(err) from None
    if as_json:
        print(json.dumps(_with_attention(status_json(s), heed), indent=2))
        return
    out.print(status_table([s], out))
    for said in heed:  # what waits on the operator: a held batch, results about to expire
        out.print(said, markup=False, style="yellow")
    if len(s.placement) > 1 or any(why for _, why, _, _ in s.placement):
        out.print(placement_table(s, out))
    if s.tiers:
        out.print(tiers_table(s, out))
    if s.failures:
        out.print("failures: " + ", ".join(f"{code} × {n}" for code, n in sorted(s.failures.items())))
    out.print(f"tokens: {s.tokens.get('input_tokens', 0):,} in, {s.tokens.get('output_tokens', 0):,} out over {s.tokens.get('attempts', 0):,} attempts")
    _print_budget(s)
    if s.notifications:
        n = s.notifications
        out.print(f"notifications: {n.get('delivered', 0)} delivered, {n.get('pending', 0)} pending, "
                  f"{n.get('dead', 0)} given up (events below; docs/notifications.md)", markup=False)  # fmt: skip
    for event in s.events:
        out.print(f"  {event}", markup=False)


def _with_attention(shape: dict, said: list[str]) -> dict:
    """A job's status JSON, with `attention` (engine/attention.py) only when something waits on the operator."""
    return shape | {"attention": said} if said else shape


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
    out_path: Annotated[
        str | None,
        typer.Option("--out", "-o", help="File or object-store URL (s3://, gs://, az://) to write: .csv, .jsonl or .parquet "
                     "(embedding jobs: .parquet, .jsonl or .npy)."),
    ] = None,
    pg_url: Annotated[
        str | None, typer.Option("--pg-url", help="Embedding jobs: upsert the vectors into a PostgreSQL table at this URL.")
    ] = None,
    pg_table: Annotated[str, typer.Option("--pg-table", help="The table --pg-url writes (made if missing).")] = "embeddings",
    compare: Annotated[
        str | None, typer.Option(help="A source column holding the expected answer: print the accuracy.")
    ] = None,
    full: Annotated[
        bool, typer.Option("--full", help="Add a `response` column: each provider's whole answer body, as it came.")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Write a job's results joined to its source rows by custom_id; for an eval, every
    variant's, in one table with `variant` and `correct` columns.

    Example: lowtide results classify-tickets --out results.parquet --compare gold

    Example: lowtide results eval-tickets --out answers.parquet

    Example: lowtide results doc-vectors --out vectors.npy --pg-url postgresql://127.0.0.1/app --pg-table doc_vectors
    """
    if out_path is None and pg_url is None:
        raise fail(InputError("say where the results go: --out FILE, or --pg-url URL for an embedding job's vectors"))
    try:
        npy = out_path is not None and out_path.lower().endswith(".npy")
        if out_path is not None and not npy:  # .npy: an embedding job's matrix
            check_output(out_path, "--out")
        with open_store(create=False) as store:
            if pg_url is not None:
                from lowtide.engine.vector_export import upsert_vectors

                done = upsert_vectors(store, job, pg_url, pg_table)
                console.print(f"upserted into {done['table']} ({done['column']}): {done['changed']} row(s) new or changed")
                if done["source_changed"]:
                    console.print(f"{done['source_changed']} row(s) source_changed: their vectors are for the rows' old text "
                                  "(marked in the table; run the job again with --requeue-changed)")  # fmt: skip
                if out_path is None:
                    return
            try:
                spec = job_spec(store, job)
            except JobNotFoundError:
                # An eval's results: its scoring (numpy and all) is imported only here.
                from lowtide.engine.eval_export import export_eval_results
                from lowtide.engine.evals import eval_named

                ev = eval_named(store, job)
                if ev is None:
                    raise
                if compare:
                    raise InputError("--compare is for a job; an eval's table has a `correct` column, and `lowtide compare` reports it") from None
                if scheme_of(out_path) is None:
                    report = export_eval_results(store, ev, out_path, full=full)
                else:  # eval_export takes a local path
                    from lowtide.core.spec import format_of
                    from lowtide.engine.eval_export import EvalRows

                    report = write_rows(EvalRows(store, ev, full=full), out_path, format_of(out_path.rsplit("/", 1)[-1]))
                console.print(f"wrote {report.rows:,} rows of {len(ev.members)} variants to {report.path} (columns `variant` and `correct`)")
                return
            if npy and spec.request_endpoint != "/v1/embeddings":
                check_output(out_path, "--out")  # .npy holds vectors: this job's answers are refused by name
            report = export_results(store, job, out_path, full=full)
    except LowtideError as err:
        raise fail(err) from None
    console.print(f"wrote {report.rows:,} rows to {report.path} ({', '.join(f'{n:,} {s}' for s, n in sorted(report.states.items()))})")
    note = report.pruned_note()
    if note:
        console.print(note, markup=False)
    accuracy = _accuracy(report.path, compare) if compare else None
    if as_json:
        shape = {"job": job, "path": str(report.path), "rows": report.rows, "states": dict(sorted(report.states.items()))}
        if accuracy is not None:
            shape["accuracy"] = _accuracy_json(compare, accuracy, spec)
        print(json.dumps(shape, indent=2))
    elif accuracy is not None:
        _print_accuracy(compare, accuracy, spec)


def _accuracy(path: Path, column: str) -> dict[str, list[int]]:
    """Hits per expected value: [correct, rows]."""
    from lowtide.core.sources import open_file

    source = open_file(path)
    per: dict[str, list[int]] = {}
    for chunk in source.chunks():
        columns = source.columns or list(chunk[0].values)
        if column not in columns:
            print(f'lowtide: --compare: no column "{column}" in the results; columns are: {", ".join(columns)}', file=sys.stderr)
            raise typer.Exit(EXIT_USAGE)
        answer_col = "lowtide_output" if "lowtide_output" in columns else "output"
        for row in chunk:
            gold = str(row.values.get(column, "")).strip()
            got = str(row.values.get(answer_col) or "").strip()
            hit = per.setdefault(gold, [0, 0])
            hit[0] += got.lower() == gold.lower()
            hit[1] += 1
    return per


def _accuracy_json(column: str, per: dict[str, list[int]], spec: JobSpec) -> dict:
    ok = sum(v[0] for v in per.values())
    n = sum(v[1] for v in per.values())
    return {
        "column": column, "rows": n, "correct": ok, "accuracy": ok / n if n else None,
        "by_expected": [{"expected": g, "rows": r, "correct": c} for g, (c, r) in sorted(per.items())],
        "chance": 1 / len(spec.effective_choices) if spec.effective_choices else None,
    }  # fmt: skip


def _print_accuracy(column: str, per: dict[str, list[int]], spec: JobSpec) -> None:
    """Share of rows whose answer equals the expected column, per expected value."""
    rows = [[markup_escape(gold), f"{n:,}", f"{ok:,}", f"{ok / n:.0%}"] for gold, (ok, n) in sorted(per.items())]
    ok = sum(v[0] for v in per.values())
    n = sum(v[1] for v in per.values())
    rows.append(["[bold]all", f"{n:,}", f"{ok:,}", f"[bold]{ok / n:.1%}" if n else "-"])
    cols = [Col("expected"), Col("rows", figure=True), Col("correct", figure=True), Col("accuracy", figure=True)]
    table = fitted_table(out, cols, rows, title=f"accuracy against {markup_escape(column)} ({spec.model} on {spec.route})")
    if spec.effective_choices:
        table.caption = f"chance level with {len(spec.effective_choices)} choices: {1 / len(spec.effective_choices):.0%}"
    out.print(table)


def cancel(
    job: JobName,
    force: Annotated[bool, typer.Option("--force", help="Do not wait for batches whose create may or may not have "
                                        "reached the provider (a provider that cannot be reached): cancel their "
                                        "requests now. If such a create did land, that batch runs and is paid for "
                                        "there, and its results are not brought in.")] = False,
    as_json: AsJson = False,
) -> None:  # fmt: skip
    """Cancel a job: unsent requests are cancelled, provider batches asked to stop.

    Results a provider had already produced are still brought in (they are paid for). A
    batch being created when the cancel came is looked up at the provider first; while the
    provider cannot be reached, that wait has no end: `--force` ends it, with the risk said.

    Example: lowtide cancel classify-tickets
    """
    try:
        with open_store(create=False) as store:
            was = job_status(store, job, events=0).state
            n = cancel_job(store, job, SystemClock(), force=force)
            now = job_status(store, job, events=0)
    except LowtideError as err:
        raise fail(err) from None
    batches = sum(now.phases.values())
    if as_json:
        shape = {"job": job, "was": was, "state": now.state, "cancelled_now": n, "in_flight": now.in_flight, "live_batches": batches}
        print(json.dumps(shape, indent=2))
        return
    # Requests in a batch already sent finish there (or are cancelled by the provider): say so.
    flight = f"; {now.in_flight:,} request(s) in {batches} live batch(es), asked to stop" if batches else ""
    if was == now.state:  # finished, or cancelled already
        if batches:
            console.print(f"{job} is {now.state} already{flight}", markup=False)
        else:
            console.print(f"nothing to cancel: {job} is {now.state}", markup=False)
    else:
        console.print(f"cancelled {job}: {n:,} unsent request(s) cancelled{flight}", markup=False)
    if batches:
        console.print("run `lowtide tick` or a worker to collect what those batches finished (it is paid for)")


def retry(
    job: JobName,
    failed: Annotated[bool, typer.Option("--failed", help="Retry the requests that failed.")] = False,
    cancelled: Annotated[bool, typer.Option("--cancelled", help="Retry the requests that were cancelled.")] = False,
    as_json: AsJson = False,
) -> None:
    """Queue failed (or cancelled) requests again with a fresh attempt budget.

    Example: lowtide retry classify-tickets --failed && lowtide worker --until-idle
    """
    if not (failed or cancelled):
        say_error("say what to retry: --failed, --cancelled, or both")
        raise typer.Exit(EXIT_USAGE)
    try:
        with open_store(create=False) as store:
            n = retry_job(store, job, SystemClock(), failed=failed, cancelled=cancelled)
    except LowtideError as err:
        raise fail(err) from None
    if as_json:
        print(json.dumps({"job": job, "queued": n}, indent=2))
        return
    console.print(f"queued {n:,} request(s) of {job} again", markup=False)
