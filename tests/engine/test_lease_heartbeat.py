"""A direct dispatch's lease is renewed while its route call is in flight, whether or not an
answer has arrived (issue 15, item 6): a second engine on the same store never reclaims the
requests of a live worker waiting on a slow upstream, so they are sent once.

The upstream is a real HTTP server on loopback (tests/routes/upstream.py) that holds every
answer until the test lets them go; the engines run on a ManualClock, which the test moves
well past the lease while the call is held."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import sqlalchemy as sa

from lowtide.core.states import DispatchState
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.schema import dispatches
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.upstream import Upstream

LEASE = 30.0


class HeldUpstream(Upstream):
    """Answers no completion until `release()`."""

    def __init__(self):
        super().__init__()
        self._gate = asyncio.Event()  # bound to the server's loop on first wait
        self.waiting = 0  # calls that arrived and are being held

    async def _answer(self, method, path, headers, raw, writer):
        if method == "POST":  # the completions; the route's probe of /props goes through
            self.waiting += 1
            await self._gate.wait()
        return await super()._answer(method, path, headers, raw, writer)

    def release(self) -> None:
        self._loop.call_soon_threadsafe(self._gate.set)


async def _until(check, what: str, timeout: float = 20.0):
    """Await until `check()` is truthy (bounded: the timeout is a safety net, not a timing)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _lease_until(store) -> float | None:
    with store.begin() as conn:
        return conn.execute(
            sa.select(dispatches.c.lease_until).where(dispatches.c.state == DispatchState.RUNNING.value)
        ).scalar()


def test_a_slow_call_keeps_its_lease_and_a_second_engine_does_not_reclaim_it(store, clock, tmp_path):
    with HeldUpstream() as upstream:
        source = write_csv(tmp_path / "t.csv", ticket_rows(4))
        spec = make_spec(
            source, route="openai-compatible", template={"system": "Be brief.", "user": "{{ ticket_id }}"},
            route_options={"base_url": f"{upstream.url}/v1", "timeout": 120},
        )  # fmt: skip
        load_job(store, spec, clock)
        other = Store(store.location)

        async def go():
            async with Engine(store, clock, lease=LEASE) as a, Engine(other, clock, lease=LEASE) as b:
                tick = asyncio.create_task(a.tick("tickets"))
                await _until(lambda: upstream.waiting == 4, "the four calls to reach the upstream")
                reclaimed = 0
                for _ in range(4):  # 80 s in all, well past the 30 s lease
                    clock.advance(LEASE * 2 / 3)
                    await _until(lambda: _lease_until(store) == clock.now() + LEASE, "the lease to be renewed")
                    reclaimed += b.reclaim()
                upstream.release()
                report = await tick
                return reclaimed, report.ingested.succeeded

        try:
            reclaimed, succeeded = asyncio.run(go())
        finally:
            other.close()
    assert (reclaimed, succeeded) == (0, 4)
    assert Counter(s.key for s in upstream.seen) == {f"T{1000 + i}": 1 for i in range(4)}  # each sent once
