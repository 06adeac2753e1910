"""A chunk's upload and create keep their submit lease, so a second worker never sends the
chunk again while the first is still sending it (DESIGN invariant 3); and a worker whose
create lands after another worker took the chunk over anyway does not call its batch
submitted: it is cancelled at the provider and booked, never applied.

Two engines on one store (each with its own Store, as two workers have), the real
`openai-batch` route against `lowtide serve`, whose fault plan holds the first upload
(`POST /v1/files`) for a few real seconds: a 2 GB file or a slow link, for which the
900 s of `SUBMIT_LEASE` pass on the engines' ManualClock while it is held."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest
import sqlalchemy as sa

from lowtide.core.clock import ManualClock
from lowtide.core.states import DispatchState, RequestState
from lowtide.engine.batches import SUBMIT_LEASE
from lowtide.engine.control import job_done
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches, events, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import _options

HELD = 8  # real seconds serve holds the first upload: longer than the test's steps take
LOOK = 2.0  # real seconds to wait for a lease renewal (the heartbeat looks every 0.2 s)


def _held_serve(serve, tmp_path) -> str:
    plan = tmp_path / "faults.yaml"
    plan.write_text(f'http:\n  - match: "POST /v1/files"\n    calls: [1]\n    delay: {HELD}\n')
    # A scaled hour before a batch completes (one real second): a cancel reaches it first.
    return serve("--faults", str(plan), "--complete-after", "3600")


def _job(store, tmp_path, url: str, clock) -> None:
    source = write_csv(tmp_path / "t.csv", ticket_rows(4))
    load_job(store, make_spec(source, model="gpt-4o-mini", route="openai-batch", route_options=_options("openai-batch", url)), clock)


def _provider_batches(url: str) -> list[tuple[str, str | None, str]]:
    """(id, lowtide key, status) of every batch serve holds, asked through the official SDK."""
    with openai.OpenAI(base_url=f"{url}/v1", api_key="test-key") as client:
        return [(b.id, (b.metadata or {}).get("lowtide_key"), b.status) for b in client.batches.list()]


def _dispatch(store) -> tuple[str | None, str | None, float | None]:
    """The chunk's dispatch: its key, state and lease (all None before it is planned)."""
    with store.begin() as conn:
        first = conn.execute(sa.select(dispatches.c.key, dispatches.c.state, dispatches.c.lease_until).order_by(dispatches.c.id)).first()
    return tuple(first) if first is not None else (None, None, None)


def _events(store, kind: str) -> list[str]:
    with store.begin() as conn:
        return list(conn.scalars(sa.select(events.c.message).where(events.c.kind == kind).order_by(events.c.id)))


async def _until(check, what: str, timeout: float = 30.0) -> bool:
    """Await until `check()` is truthy (bounded: the timeout is a safety net, not a timing)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
    return True


async def _renewed(store, clock: ManualClock) -> bool:
    """Whether worker A's lease is renewed to a full SUBMIT_LEASE from the clock's time,
    within LOOK real seconds: the heartbeat looks at the engine clock five times a second."""
    deadline = time.monotonic() + LOOK
    while _dispatch(store)[2] != clock.now() + SUBMIT_LEASE:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def _to_the_end(engine: Engine, clock: ManualClock, timeout: float = 60.0) -> None:
    """Tick until the job is done and no batch of it is left to bring in. serve runs its
    batches in real time: the engine clock moves a poll interval a tick meanwhile."""
    deadline = time.monotonic() + timeout  # a safety net, not a timing
    while not job_done(engine.store, "tickets"):
        assert time.monotonic() < deadline, "the job did not end"
        await engine.tick("tickets")
        clock.advance(1.0)
        await asyncio.sleep(0.05)  # (serve's turn)


def test_a_held_upload_keeps_its_submit_lease_and_a_second_worker_sends_nothing(serve, store, clock, tmp_path):
    url = _held_serve(serve, tmp_path)
    _job(store, tmp_path, url, clock)
    other = Store(store.location)

    async def go():
        async with Engine(store, clock) as a, Engine(other, clock) as b:
            sending = asyncio.create_task(a.tick("tickets"))  # plans the chunk; its upload is held
            await _until(lambda: _dispatch(store)[1] == DispatchState.SUBMITTING, "worker A to begin sending")
            missed, b_sent = False, 0
            for _ in range(4):  # 1,200 s of the engine clock while the upload is held, past the 900 s lease
                clock.advance(SUBMIT_LEASE / 3)
                if not missed and not await _renewed(store, clock):
                    missed = True  # nothing renews it: no more waiting for renewals
                b_sent += (await b.tick("tickets")).submitted
            assert not sending.done(), f"the upload was not held for the whole test: make HELD longer than {HELD} s"
            return missed, b_sent, (await sending).submitted

    try:
        missed, b_sent, a_sent = asyncio.run(go())
    finally:
        other.close()
    key = _dispatch(store)[0]
    assert [k for _, k, _ in _provider_batches(url)] == [key]  # one provider batch for the chunk
    assert (missed, b_sent, a_sent) == (False, 0, 1)
    assert len(_events(store, "submitted")) == 1 and _events(store, "duplicate_batch") == []


def test_a_create_that_lands_after_a_takeover_is_cancelled_and_booked_not_submitted(serve, store, tmp_path):
    """Worker A stalls (its clock, and so its heartbeat, stands still: a process paused, a
    machine asleep) for longer than the lease, while worker B's clock runs on: B takes the
    chunk over, finds no batch (A's upload is still held) and sends it. A's create lands
    after: a second batch of the same requests. A does not say `submitted`; it records the
    batch as a duplicate, cancels it at the provider, and its bill is booked, never applied."""
    url = _held_serve(serve, tmp_path)
    a_sent, b_sent, _ = _taken_over(store, tmp_path, url)  # B brings its batch in; the duplicate ends cancelled
    key = _dispatch(store)[0]
    batches = {i: status for i, k, status in _provider_batches(url) if k == key}
    with store.begin() as conn:
        held = dict(conn.execute(sa.select(dispatches.c.provider_id, dispatches.c.state)).all())
        applied = conn.execute(
            sa.select(requests.c.state, attempts.c.dispatch_id, dispatches.c.provider_id)
            .join(attempts, attempts.c.request_id == requests.c.id)
            .join(dispatches, dispatches.c.id == attempts.c.dispatch_id)
            .where(attempts.c.applied.is_(True))
        ).all()  # fmt: skip
    [sent] = _events(store, "submitted")
    [twice] = _events(store, "duplicate_batch")
    assert (a_sent, b_sent) == (0, 1)
    assert len(batches) == 2 and set(held) == set(batches)  # the store holds both
    [theirs] = [p for p in batches if p in sent]
    [ours] = [p for p in batches if p != theirs]
    assert ours in twice and theirs in twice
    assert batches[ours] == "cancelled" and batches[theirs] == "completed"
    assert held == {theirs: DispatchState.ENDED, ours: DispatchState.ENDED}
    assert len(applied) == 4 and {(s, p) for s, _, p in applied} == {(RequestState.SUCCEEDED, theirs)}


@pytest.mark.parametrize("status, said", [(400, "batch_rejected"), (500, "submit_error")])
def test_a_create_that_fails_after_a_takeover_leaves_the_other_workers_chunk_alone(serve, store, tmp_path, status, said):
    """Worker A stalls past its lease while its create is on its way; worker B takes the chunk
    over and sends it. A's create then fails, the chunk being B's by now:
    - refused (400): A failed the chunk's requests for good (batch_rejected), though they were
      in B's batch, which then ran for nothing;
    - failed transiently (500): A cleared the chunk's lease and wrote its error on it (a third
      worker could have taken over B's create).
    Now the failure is A's alone: the chunk is B's, its requests answered by B's batch."""
    plan = tmp_path / "faults.yaml"
    plan.write_text(f'http:\n  - match: "POST /v1/batches"\n    calls: [1]\n    delay: {HELD}\n    status: {status}\n')
    a_sent, b_sent, error = _taken_over(store, tmp_path, serve("--faults", str(plan)))
    with store.begin() as conn:
        states = conn.execute(sa.select(requests.c.state, requests.c.error_code)).all()
    assert (a_sent, b_sent, error) == (0, 1, None)
    assert states == [(RequestState.SUCCEEDED, None)] * 4
    assert _events(store, said) == []


def _taken_over(store, tmp_path, url: str) -> tuple[int, int, str | None]:
    """Worker A begins sending the chunk and stalls (its clock, and so its heartbeat, stands
    still: a process paused, a machine asleep) past its lease, while worker B's clock runs
    on: B takes the chunk over and sends it; then A's create ends, and B brings its batch in.
    (What A sent, what B sent, the chunk's error as A's create left it.)"""
    clock_a = ManualClock(time.time())
    clock_b = ManualClock(clock_a.now() + SUBMIT_LEASE + 60)
    _job(store, tmp_path, url, clock_a)
    other = Store(store.location)

    async def go():
        async with Engine(store, clock_a) as a, Engine(other, clock_b) as b:
            sending = asyncio.create_task(a.tick("tickets"))
            await _until(lambda: _dispatch(store)[1] == DispatchState.SUBMITTING, "worker A to begin sending")
            b_sent = (await b.tick("tickets")).submitted  # A's lease has run out by B's clock
            a_sent = (await sending).submitted
            with store.begin() as conn:  # before B's polls, which write their own
                error = conn.execute(sa.select(dispatches.c.error).order_by(dispatches.c.id)).scalars().first()
            await _to_the_end(b, clock_b)
            return a_sent, b_sent, error

    try:
        return asyncio.run(go())
    finally:
        other.close()
