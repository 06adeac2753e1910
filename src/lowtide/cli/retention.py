"""`lowtide delete` and `lowtide prune`: what the store keeps (engine/retention.py does it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from lowtide.cli.common import EXIT_USAGE, console, fail, open_store, out, say_error
from lowtide.core.auto_spec import duration_text, parse_duration
from lowtide.core.clock import SystemClock
from lowtide.core.errors import LowtideError
from lowtide.engine.control import cancel_job, job_status
from lowtide.engine.retention import DETACHED_TABLES, InFlightError, delete_job, in_flight, prune
from lowtide.store.space import reclaim, store_bytes

Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation (needed where no one can answer: cron, a pipe).")]


def register(app: typer.Typer) -> None:
    app.command("delete")(delete)
    app.command("prune")(prune_command)


def _confirm(question: str, yes: bool) -> None:
    """Ask, unless --yes; with no terminal to ask on, refuse (exit 2) rather than guess."""
    if yes:
        return
    if not sys.stdin.isatty():
        say_error(f"{question.rstrip('?')}: no terminal to confirm on; pass --yes to go ahead")
        raise typer.Exit(EXIT_USAGE)
    if not typer.confirm(question, default=False):
        say_error("nothing deleted")
        raise typer.Exit(EXIT_USAGE)


def delete(
    job: Annotated[str, typer.Argument(help="The job's name (the `name:` of its spec).", show_default=False)],
    yes: Yes = False,
    cancel: Annotated[
        bool,
        typer.Option("--cancel", help="Cancel the job first (as `lowtide cancel` does); delete only once none of its batches is in flight."),
    ] = False,
) -> None:
    """Delete a job and everything stored for it: requests, answers, batches, attempts
    (its ledger), events. In one transaction; other jobs are not touched. Records that
    outlive the job forget it: an ended API batch of `lowtide serve`, a done gateway flush;
    an eval's record goes with the last of its jobs.

    Refused while any of its batches is in flight (sent and not back): their results would
    come back to nothing. `--cancel` cancels the job first; batches a provider is still
    stopping keep the job until `lowtide tick` or a worker has collected them, then run
    delete again. Its notifications not yet delivered go too, never sent: the question and
    the output say how many.

    Example: lowtide delete test-tickets --yes
    """
    clock = SystemClock()
    try:
        with open_store(create=False) as store:
            status = job_status(store, job, events=0)
            flying = in_flight(store, job)
            if flying and not cancel:
                raise InFlightError(
                    f'job "{job}" has {len(flying)} batch(es) in flight ({"; ".join(str(f) for f in flying[:5])}): nothing '
                    f"deleted; pass --cancel to cancel it first (`lowtide delete {job} --cancel`), or wait until they end",
                    [str(f) for f in flying],
                )
            # A notification not yet delivered goes with the job: its receiver never hears of it.
            undelivered = status.notifications.get("pending", 0)
            unsent = f"; its {undelivered:,} notification(s) not yet delivered will never be sent" if undelivered else ""
            _confirm(f"delete job {job} ({status.state}, {status.total:,} request(s)) and everything stored for it{unsent}?", yes)
            if cancel:
                n = cancel_job(store, job, clock)
                if n:
                    console.print(f"cancelled {job}: {n:,} unsent request(s) cancelled", markup=False)
                flying = in_flight(store, job)
                if flying:
                    say_error(
                        f"{job}: cancelled, but {len(flying)} batch(es) are still in flight, asked to stop "
                        f"({'; '.join(str(f) for f in flying[:5])}); nothing deleted. Run `lowtide tick` or a worker "
                        f"until they end, then `lowtide delete {job}` again"
                    )
                    raise typer.Exit(EXIT_USAGE)
            counts = delete_job(store, job, clock)
    except LowtideError as err:
        raise fail(err) from None
    order = ["requests", *(t for t in counts if t not in ("requests", "jobs", *DETACHED_TABLES))]
    rows = ", ".join(f"{counts[table]:,} {table}" for table in order if counts[table])
    detached = ", ".join(f"{counts[table]:,} {table}" for table in DETACHED_TABLES if counts.get(table))
    out.print(f"deleted {job}" + (f": {rows}" if rows else "") + (f"; detached from {detached}" if detached else ""), markup=False)
    if undelivered:
        console.print(f"{job}: {undelivered:,} notification(s) not yet delivered were deleted with it and will never be sent", markup=False)


def prune_command(
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Jobs finished (or cancelled) longer ago than this: 30d, 12h, 90m; every such job alike. "
            "Without it, each job as its own `retention:` says (jobs without one are left alone).",
            show_default=False,
        ),
    ] = None,
    keep_results: Annotated[
        bool, typer.Option("--keep-results", help="Keep the answers (output, parsed); drop only payloads and raw responses.")
    ] = False,
    archive: Annotated[
        Path | None,
        typer.Option(
            "--archive",
            help="First write what is dropped to DIR/JOB.<time>.parquet, one file per job, fsynced; if that fails nothing is dropped.",
            metavar="DIR",
            show_default=False,
        ),
    ] = None,
    vacuum: Annotated[
        bool,
        typer.Option(
            "--vacuum",
            help="Then give the space back: SQLite VACUUM (rewrites the file; holds the store's lock), PostgreSQL VACUUM.",
        ),
    ] = False,
    yes: Yes = False,
) -> None:
    """Drop what old finished jobs no longer need: the payloads that were sent, the providers'
    whole responses and (unless --keep-results) the answers. Request states, token counts,
    errors, attempts and events stay, so `lowtide status` and `lowtide report` add up as
    before. Failed and cancelled requests keep their payload (`lowtide retry` sends it).

    Without --older-than, each job's own `retention: {payloads: 30d, results: 90d}` decides.

    Example: lowtide prune --older-than 30d --keep-results --archive /backups/lowtide --vacuum --yes
    """
    seconds = None
    if older_than is not None:
        try:
            seconds = parse_duration(older_than)
        except ValueError:
            say_error(f"--older-than {older_than!r}: give a duration such as 30d, 12h or 90m")
            raise typer.Exit(EXIT_USAGE) from None
    clock = SystemClock()
    try:
        with open_store(create=False) as store:
            preview = prune(store, clock, seconds, keep_results=keep_results, dry_run=True)
            if not preview.jobs:
                if seconds is None:
                    out.print(
                        "nothing to prune: no finished job's own `retention:` has come due with bodies left "
                        "(give --older-than to prune jobs by age)",
                        markup=False,
                    )
                else:
                    out.print(f"nothing to prune: no finished job older than {duration_text(seconds)} has bodies left", markup=False)
                return
            names = ", ".join(preview.jobs[:10]) + (f" and {len(preview.jobs) - 10} more" if len(preview.jobs) > 10 else "")
            if not preview.kept_results:
                what = "payloads, responses and answers"
            elif len(preview.kept_results) == len(preview.jobs):
                what = "payloads and raw responses"
            else:
                what = f"payloads and raw responses (and answers of {len(preview.jobs) - len(preview.kept_results)})"
            to = f", archived first under {archive}" if archive is not None else ""
            _confirm(f"drop the {what} of {len(preview.jobs)} job(s) ({names}), about {_size(preview.bytes)}{to}?", yes)
            before = store_bytes(store) if vacuum else 0
            done = prune(store, clock, seconds, keep_results=keep_results, archive=archive)
            vacuumed = reclaim(store) if vacuum and done.jobs else None
            after = store_bytes(store) if vacuumed else 0
    except LowtideError as err:
        raise fail(err) from None
    out.print(
        f"pruned {len(done.jobs)} job(s): {done.requests:,} request(s), {done.versions:,} earlier version(s), "
        f"about {_size(done.bytes - done.kept)} freed" + ("" if vacuum else " (the database file shrinks after a VACUUM: --vacuum)"),
        markup=False,
    )
    for job, path in done.archives.items():
        if job in done.jobs:
            out.print(f"  archived {job}: {path}", markup=False)
    if done.skipped:
        out.print(f"  left alone, changed while archiving (a retry?): {', '.join(done.skipped)}", markup=False)
    if vacuumed:
        out.print(f"{vacuumed}: the store takes {_size(after)} (was {_size(before)})", markup=False)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"
