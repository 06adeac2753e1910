"""`lowtide worker --until-idle` stops when nothing is left to do, not while another
process's create still holds a batch (`Engine.next_due`).

A worker SIGKILLed mid-create leaves its dispatch `submitting` under a lease; until the lease
runs out, or its process is seen dead (a killed child its parent has not reaped yet still
answers `kill(pid, 0)`), nobody may take it over. An `--until-idle` worker that found
nothing else due stopped there, its requests dispatched. (Found reading the code after the
three-worker kill test in tests/reliability/test_kill.py failed that way; that failure came
again with this fixed, so its cause is another.)
"""

from __future__ import annotations

import asyncio
import os
import socket

import sqlalchemy as sa

from lowtide.core.clock import ManualClock
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.schema import dispatches
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import serve  # noqa: F401  (a fixture; the test taking it says noqa: F811)


def test_a_create_another_live_process_holds_keeps_until_idle_going(store, tmp_path):
    clock = ManualClock()
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3)), route="echo-batch", route_options={"dir": str(tmp_path / "p")})
    load_job(store, spec, clock)
    lease_until = clock.now() + 900
    other = f"{socket.gethostname()}:{os.getppid()}:another-worker"  # a process that is alive

    async def go() -> float | None:
        async with Engine(store, clock) as engine:
            await engine.tick("tickets")  # planned and sent
            with store.begin() as conn:  # as if that process's create were still in flight
                conn.execute(
                    sa.update(dispatches).values(state="submitting", provider_id=None, owner=other, lease_until=lease_until)
                )
            return engine.next_due()

    assert asyncio.run(go()) == lease_until



def test_a_direct_dispatch_another_live_process_runs_keeps_until_idle_going(store, tmp_path):
    """Another worker's direct dispatch (its calls in flight under a lease): counted as the
    create above is, so an `--until-idle` worker is still there to take its requests back
    should that worker die. It stopped, nothing else being due."""
    clock = ManualClock()
    load_job(store, make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3))), clock)
    lease_until = clock.now() + 120
    other = f"{socket.gethostname()}:{os.getppid()}:another-worker"  # a process that is alive
    with store.begin() as conn:  # as that worker's claim leaves the job: every request in its dispatch
        conn.execute(sa.insert(dispatches).values(job_id=1, route="echo", kind="direct", key="k", state="running", size=3,
                                                  created_at=clock.now(), owner=other, lease_until=lease_until))  # fmt: skip
        conn.execute(sa.text("UPDATE requests SET state = 'dispatched', dispatch_id = 1"))

    async def go() -> float | None:
        async with Engine(store, clock) as engine:
            return engine.next_due()

    assert asyncio.run(go()) == lease_until


def test_a_chunk_whose_create_failed_keeps_until_idle_going_until_it_is_sent(serve, store, tmp_path):  # noqa: F811
    """A create the provider answered with a 500 lets its lease go (the next tick finds or
    sends the chunk again), and `next_due` counted only a create under a running lease:
    `worker --until-idle` exited 0 with every request dispatched and nothing sent, and the
    next run did the same while the provider kept failing. The chunk is due again a little
    later (RESEND_WAIT), each time, until it is sent."""
    from lowtide.engine import tick
    from tests.routes.conftest import _options

    RESEND_WAIT = getattr(tick, "RESEND_WAIT", 5.0)  # noqa: N806  (the engine's, read as the test runs)

    plan = tmp_path / "faults.yaml"
    plan.write_text('http:\n  - match: "POST /v1/batches"\n    calls: [1, 2]\n    status: 500\n')
    url = serve("--faults", str(plan))
    clock = ManualClock()
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3)), model="gpt-4o-mini", route="openai-batch",
                     route_options=_options("openai-batch", url))  # fmt: skip
    load_job(store, spec, clock)

    async def go() -> list[tuple[int, float | None]]:
        seen = []
        async with Engine(store, clock) as engine:
            for _ in range(3):  # two creates refused, then the one that is sent
                report = await engine.tick("tickets")
                seen.append((report.submitted, engine.next_due()))
                clock.advance(RESEND_WAIT)
        return seen

    seen = asyncio.run(go())
    start = clock.now() - 3 * RESEND_WAIT
    assert seen[:2] == [(0, start + RESEND_WAIT), (0, start + 2 * RESEND_WAIT)]
    assert seen[2][0] == 1 and seen[2][1] is not None  # sent: its poll is what is due now
    with store.begin() as conn:
        assert conn.execute(sa.select(dispatches.c.state)).scalar_one() == "submitted"


def test_a_job_deleted_while_a_tick_works_on_the_others_is_left_be(store, tmp_path, monkeypatch):
    """`lowtide delete` of a job with nothing in flight is allowed while a worker runs; when it
    landed after the worker's tick had read its jobs, the tick's `finish` of that job found no
    row (NoResultFound) and the worker ended, "unexpected error", exit 3. The tick goes on
    with the other jobs and leaves the deleted one be."""
    from lowtide.engine.control import job_status
    from lowtide.engine.retention import delete_job

    clock = ManualClock()
    for name in ("a", "b"):
        load_job(store, make_spec(write_csv(tmp_path / f"{name}.csv", ticket_rows(3)), name=name), clock)
    read = Engine._jobs

    def read_then_delete(engine, job_name):  # the jobs as the tick read them, then b deleted by the operator
        found = read(engine, job_name)
        delete_job(store, "b", clock)
        return found

    monkeypatch.setattr(Engine, "_jobs", read_then_delete)

    async def go():
        async with Engine(store, clock) as engine:
            return await engine.tick()

    report = asyncio.run(go())
    assert report.finished == ["a"] and job_status(store, "a").counts == {"succeeded": 3}
