"""The progress display's cheap read (`progress_status`) says what `job_status` says about
the counts it shows, at every step of a batch job; `JobProgress.watch` follows a run with
it and ends on the run's own final status."""

from __future__ import annotations

import asyncio
import io

import pytest
from rich.console import Console

from lowtide.core.clock import ManualClock
from lowtide.engine.control import job_status
from lowtide.engine.loader import load_job
from lowtide.engine.progress import JobProgress, progress_status
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from tests.conftest import make_spec, ticket_rows, write_csv

SHOWN = ("state", "route", "counts", "phases", "dispatched", "dispatches", "in_flight", "queued", "total")


def _shown(status) -> dict:
    return {field: getattr(status, field) for field in SHOWN}


def test_progress_status_counts_as_job_status_at_every_tick(store, tmp_path):
    clock = ManualClock()
    options = {"dir": str(tmp_path / "batches"), "max_requests": 10, "polls_to_complete": 2, "fail_attempts": {"T1003": 1}}
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(25)), route="echo-batch", route_options=options,
                     retry={"max_attempts": 2, "backoff_seconds": 10})  # fmt: skip
    load_job(store, spec, clock)
    seen = []

    async def go():
        async with Engine(store, clock, seed=3) as engine:
            for _ in range(40):
                cheap, full = progress_status(store, spec.name), job_status(store, spec.name)
                assert _shown(cheap) == _shown(full)
                seen.append((cheap.in_flight, cheap.queued, tuple(sorted(cheap.phases))))
                if full.done:
                    return
                await engine.tick(spec.name)
                clock.advance(60)
        raise AssertionError("the job did not end")

    asyncio.run(go())
    assert any(flight for flight, _, _ in seen) and any(queued for _, queued, _ in seen)  # the counts moved through both


def test_watch_follows_a_run_and_ends_on_its_final_status(sqlite_store, tmp_path):
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(20)), route="echo", route_options={"dispatch_size": 5})
    load_job(sqlite_store, spec, ManualClock())
    text = io.StringIO()

    async def go():
        with JobProgress(Console(file=text, width=200), "run tickets", every=0) as progress:
            async with Engine(sqlite_store, seed=1) as engine:
                status = await progress.watch(drive(engine, spec.name), sqlite_store, spec.name, refresh=0)
            assert progress.last is status  # the final, whole status: tokens and cost are in it
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []  # the follower stopped
        return status

    status = asyncio.run(go())
    assert status.tokens["attempts"] == 20
    assert text.getvalue().splitlines()[-1].startswith("run tickets: 20 of 20 done (20 ok)")


def test_watch_stops_following_when_the_run_fails(sqlite_store, tmp_path):
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3)))
    load_job(sqlite_store, spec, ManualClock())

    async def broken():
        await asyncio.sleep(0.01)  # the follower has looked at least once meanwhile
        raise RuntimeError("the store went away")

    async def go():
        with pytest.raises(RuntimeError, match="went away"):
            await JobProgress(Console(file=io.StringIO()), "run tickets", every=0).watch(broken(), sqlite_store, spec.name)
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(go())
