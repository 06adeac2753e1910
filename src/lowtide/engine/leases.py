"""Keeping a dispatch's lease while a route works on it: a heartbeat on the engine clock.

A direct dispatch (`running`) holds its lease while its calls are in flight; a batch chunk
(`submitting`) while its upload and create, or the `find` for them, are on their way. Without
it a slow call outlives the lease and another worker takes the work over and pays for it
again: a 900 s direct timeout against a 120 s lease; a 2 GB Gemini upload, or 200 MB on a
slow link, against the 900 s submit lease (DESIGN invariant 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from lowtide.core.clock import Clock
from lowtide.core.states import DispatchState
from lowtide.store.db import Store
from lowtide.store.schema import dispatches

HEARTBEAT_LOOK = 0.2  # real seconds between looks at the engine clock for a lease renewal
log = logging.getLogger(__name__)


async def heartbeat(store: Store, dispatch_id: int, owner: str, state: DispatchState, clock: Clock, lease: float) -> None:
    """Renew the dispatch's lease every lease/3 of the engine clock for as long as `owner`
    holds it in `state`, whether or not the route has anything to show yet. The clock is
    read every HEARTBEAT_LOOK real seconds (a test's ManualClock moves when it is told)."""
    every = lease / 3
    renewed = clock.now()
    while True:
        await asyncio.sleep(min(HEARTBEAT_LOOK, every))
        now = clock.now()
        if now - renewed < every:
            continue
        try:
            with store.begin() as conn:
                held = conn.execute(
                    dispatches.update()
                    .where(dispatches.c.id == dispatch_id, dispatches.c.owner == owner, dispatches.c.state == state.value)
                    .values(lease_until=now + lease)
                ).rowcount
        except Exception as err:  # the store is busy or away: try again at the next look
            log.warning("lease renewal of dispatch %s failed: %s", dispatch_id, err)
            continue
        if not held:  # taken over, or moved on: nothing left to hold
            return
        renewed = now


@contextlib.asynccontextmanager
async def kept(store: Store, dispatch_id: int, owner: str, state: DispatchState, clock: Clock, lease: float) -> AsyncIterator[None]:
    """The dispatch's lease renewed by `heartbeat` while the block runs."""
    beat = asyncio.create_task(heartbeat(store, dispatch_id, owner, state, clock, lease))
    try:
        yield
    finally:
        beat.cancel()
        await asyncio.gather(beat, return_exceptions=True)
