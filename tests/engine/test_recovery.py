"""Crash recovery inside the engine: adoption of a batch sent by a dead process, reclaiming
a dead worker's requests, validation failures that must not loop, cancel and retry."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import sqlalchemy as sa

from lowtide.core.states import DispatchState, JobState, RequestState
from lowtide.engine import batches
from lowtide.engine.control import cancel_job, job_status, retry_job
from lowtide.engine.dispatch import dispatched_requests
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.routes.base import BatchStatus
from lowtide.routes.own.echo_batch import EchoBatchRoute
from lowtide.store.schema import dispatches, requests
from lowtide.store.transitions import move_dispatch
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv


def test_a_batch_sent_before_a_crash_is_adopted_not_sent_again(store, clock, tmp_path):
    provider = tmp_path / "provider"
    source = write_csv(tmp_path / "t.csv", ticket_rows(6))
    spec = make_spec(source, route="echo-batch", route_options={"dir": str(provider)})
    load_job(store, spec, clock)

    async def crash_after_create():
        async with Engine(store, clock) as engine:
            job = engine._jobs("tickets")[0]
            route = engine.route_for(job.lanes[0])
            batches.plan(store, job, route, clock)
            with store.begin() as conn:
                dispatch_id, key = conn.execute(sa.select(dispatches.c.id, dispatches.c.key)).one()
                move_dispatch(conn, dispatch_id, DispatchState.PLANNED, DispatchState.SUBMITTING)
                batch = dispatched_requests(conn, dispatch_id)
            await route.submit(key, batch)  # the provider has it; the process dies here

    asyncio.run(crash_after_create())
    assert len(list(provider.glob("*/meta.json"))) == 1
    status = drive_to_end(store, spec, clock)
    assert status.counts == {"succeeded": 6}
    assert len(list(provider.glob("*/meta.json"))) == 1  # adopted, not submitted twice
    with store.begin() as conn:
        assert conn.execute(sa.select(dispatches.c.provider_id)).scalar_one() == next(provider.iterdir()).name


def test_a_dead_workers_requests_are_reclaimed_at_once(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(4))
    spec = make_spec(source)
    load_job(store, spec, clock)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    import socket

    from lowtide.engine.dispatch import assign, new_dispatch, pending_ids

    with store.begin() as conn:
        ids = pending_ids(conn, 1, clock.now(), 10)
        d = new_dispatch(
            conn, 1, "echo", "direct", DispatchState.RUNNING, clock.now(),
            owner=f"{socket.gethostname()}:{dead_pid}:gone", lease_until=clock.now() + 3600,
        )  # fmt: skip
        assign(conn, d, ids, "echo", clock.now())
    status = drive_to_end(store, spec, clock, step=1)  # the lease has not expired: the owner is dead
    assert status.counts == {"succeeded": 4}
    with store.begin() as conn:
        assert conn.execute(sa.select(dispatches.c.state).where(dispatches.c.id == d)).scalar_one() == "abandoned"
        assert set(conn.execute(sa.select(requests.c.attempts)).scalars()) == {1}


def test_a_live_workers_lease_is_respected_until_it_expires(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(2))
    load_job(store, make_spec(source), clock)
    from lowtide.engine.dispatch import assign, new_dispatch, pending_ids

    with store.begin() as conn:
        d = new_dispatch(conn, 1, "echo", "direct", DispatchState.RUNNING, clock.now(), owner="elsewhere:1:x", lease_until=clock.now() + 60)
        assign(conn, d, pending_ids(conn, 1, clock.now(), 10), "echo", clock.now())

    async def go():
        async with Engine(store, clock) as engine:
            first = await engine.tick()
            clock.advance(61)
            second = await engine.tick()
            return first.reclaimed, second.reclaimed

    assert asyncio.run(go()) == (0, 2)


class RejectingRoute(EchoBatchRoute):
    """A provider that fails every batch at validation."""

    async def poll(self, batch_id):
        return BatchStatus(phase="failed", ended=True, errors=["line 1: invalid_json_line: bad JSON"])


def test_a_batch_that_fails_validation_surfaces_the_error_and_does_not_loop(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    spec = make_spec(source, route="echo-batch")
    route = RejectingRoute({"dir": str(tmp_path / "p")})
    status = drive_to_end(store, spec, clock, engine=Engine(store, clock, routes={"echo-batch": route}))
    assert status.state == JobState.FINISHED
    assert status.counts == {"failed": 3}
    assert status.failures == {"batch_rejected": 3}
    assert any("invalid_json_line" in e for e in status.events)
    assert len(list((tmp_path / "p").iterdir())) == 1  # one batch: no resubmission loop


def test_cancel_stops_unsent_work_and_retry_brings_it_back(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(5))
    spec = make_spec(source)
    load_job(store, spec, clock)
    assert cancel_job(store, "tickets", clock) == 5
    status = job_status(store, "tickets")
    assert status.state == JobState.CANCELLED and status.counts == {"cancelled": 5}
    assert retry_job(store, "tickets", clock, failed=True) == 0
    assert retry_job(store, "tickets", clock, failed=False, cancelled=True) == 5
    assert drive_to_end(store, spec, clock).counts == {"succeeded": 5}


def test_cancel_collects_partial_results_of_a_batch_in_flight(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(4))
    spec = make_spec(source, route="echo-batch", route_options={"dir": str(tmp_path / "p"), "polls_to_complete": 50})
    load_job(store, spec, clock)

    async def go():
        async with Engine(store, clock) as engine:
            await engine.tick()  # plan + submit
            cancel_job(store, "tickets", clock)
            await engine.tick()  # cancel at the provider, poll, ingest
    asyncio.run(go())
    status = job_status(store, "tickets")
    assert status.state == JobState.CANCELLED
    assert status.counts == {"cancelled": 4}
    assert status.phases == {}


def test_retry_failed_gives_a_fresh_attempt_budget(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    spec = make_spec(source, route_options={"fail_attempts": {"T1001": 3}})
    assert drive_to_end(store, spec, clock).counts == {"succeeded": 2, "failed": 1}
    assert retry_job(store, "tickets", clock) == 1
    # attempt numbers restart at 1 for the budget, and echo's failures were for attempts 1-3:
    # the request fails again, proving the budget (3 more attempts) was granted and used.
    status = drive_to_end(store, spec, clock)
    assert status.counts == {"succeeded": 2, "failed": 1}
    with store.begin() as conn:
        n = conn.execute(sa.select(sa.func.count()).select_from(sa.table("attempts"))).scalar_one()
    assert n == 2 + 3 + 3


def test_deadline_fails_unsent_requests_with_the_reason(store, clock, tmp_path):
    from datetime import UTC, datetime

    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    past = datetime.fromtimestamp(clock.now() - 1, UTC).isoformat()
    spec = make_spec(source, deadline=past)
    status = drive_to_end(store, spec, clock)
    assert status.counts == {"failed": 3}
    assert status.failures == {"deadline_passed": 3}
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(requests).where(requests.c.state == RequestState.FAILED)).scalar_one() == 3
