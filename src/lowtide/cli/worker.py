"""Commands that run the engine over every job: tick (one pass, for cron) and worker (a loop)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from lowtide.cli.common import EXIT_INTERRUPTED, console, fail, open_store
from lowtide.core.errors import LowtideError
from lowtide.engine.runner import work
from lowtide.engine.tick import Engine, TickReport


def _describe(report: TickReport) -> str:
    i = report.ingested
    return (
        f"planned {report.planned}, submitted {report.submitted} batch(es), "
        f"{i.succeeded} succeeded, {i.retried} to retry, {i.failed} failed, {i.stale} stale, "
        f"{report.reclaimed} reclaimed" + (f"; finished: {', '.join(report.finished)}" if report.finished else "")
    )


def tick(
    job: Annotated[str | None, typer.Option(help="Only this job.")] = None,
) -> None:
    """Run one non-blocking pass: submit what is planned, poll what is due, ingest what ended.

    Made for cron: `* * * * * cd /srv/jobs && lowtide tick`.

    Example: lowtide tick
    """

    async def go() -> TickReport:
        with open_store() as store:
            async with Engine(store) as engine:
                return await engine.tick(job)

    try:
        report = asyncio.run(go())
    except LowtideError as err:
        raise fail(err) from None
    console.print(_describe(report))


def worker(
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Stop when nothing is left to do.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print every busy tick.")] = False,
) -> None:
    """Tick every job in a loop. Stop it any time: the next worker continues from the store.

    Example: lowtide worker --until-idle
    """

    def on_tick(report: TickReport) -> None:
        if verbose and report.busy:
            console.print(_describe(report))

    async def go() -> None:
        with open_store() as store:
            async with Engine(store) as engine:
                await work(engine, on_tick, stop_when_idle=until_idle)

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        console.print("worker stopped")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except LowtideError as err:
        raise fail(err) from None
