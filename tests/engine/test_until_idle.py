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

