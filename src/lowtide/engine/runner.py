"""Driving ticks: to the end of one job (`lowtide run`), or forever over all jobs (`worker`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError

from lowtide.engine.control import JobStatus, job_done, job_status
from lowtide.engine.tick import Engine, TickReport
from lowtide.store.db import is_busy

IDLE_WAIT_MAX = 2.0  # seconds a loop sleeps at most when nothing was due
STATUS_EVERY = 0.5  # seconds between progress reports: counting a million rows is not free
log = logging.getLogger(__name__)


async def drive(
    engine: Engine,
    job_name: str,
    on_tick: Callable[[JobStatus, TickReport], None] | None = None,
    *,
    placement: bool = True,
) -> JobStatus:
    """Tick one job until every request is terminal; return its final status (`placement`
    False: without it, a pass over every row of the job that a table does not show)."""
    last_report = 0.0
    while True:
        report = await engine.tick(job_name)
        done = job_done(engine.store, job_name)
        if on_tick and (done or time.monotonic() - last_report >= STATUS_EVERY):
            on_tick(job_status(engine.store, job_name), report)
            last_report = time.monotonic()
        if done:
            return job_status(engine.store, job_name, placement=placement)
        if not report.busy:
            await asyncio.sleep(_idle_wait(engine, job_name))


async def work(
    engine: Engine,
    on_tick: Callable[[TickReport], None] | None = None,
    *,
    once: bool = False,
    stop_when_idle: bool = False,
) -> None:
    """Tick every job, forever (or once, or until nothing is left to do). A tick the store
    was too busy for (SQLite: another process held the write lock past the busy timeout: a
    load of millions of rows, a delete) stops where that write failed, rolled back, and the
    loop ticks again, not ends: what the tick committed before stays, as when a worker starts
    again, and a worker outlasts the next night's load beside it. `once` (a cron tick)
    raises it: the next run tries again."""
    while True:
        try:
            report = await engine.tick()
        except DBAPIError as err:
            if once or not is_busy(err):
                raise
            log.warning("the store is busy (another process holds its write lock); the tick's write was rolled back, ticking again")
            continue
        if on_tick:
            on_tick(report)
        if once:
            return
        if not report.busy:
            if stop_when_idle and engine.next_due() is None:
                if engine.notifier.holding:  # attempts on their way: a retry they schedule, or one waiting for their slot, is due yet
                    await engine.notifier.settle()
                    continue
                return
            await asyncio.sleep(_idle_wait(engine, None))


def _idle_wait(engine: Engine, job_name: str | None) -> float:
    due = engine.next_due(job_name)
    if due is None:
        return IDLE_WAIT_MAX
    return min(IDLE_WAIT_MAX, max(0.01, due - engine.clock.now()))
