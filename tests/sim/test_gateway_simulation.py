"""The gateway's simulation in CI form (tests/sim/gateway.py): a fixed seed budget on both
stores, and the cases it found, replayed as plain steps. A failure prints the shrunk
sequence of steps and the command that replays it; the long form is
`bench/simulate.py --route gateway`."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from lowtide.store.gateway_schema import gateway_flushes, gateway_requests
from lowtide.store.schema import dispatches
from tests.sim.gateway import GatewayWorld, Sent, check_drained, check_step, run
from tests.sim.test_simulation import SEED

EXAMPLES = 6
STEPS = 40


@pytest.mark.parametrize("store_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_gateway_simulation(store_kind, request):
    if store_kind == "postgres":
        request.getfixturevalue("pg_schema_url")  # skips (or fails in CI) without PostgreSQL
    run(store_kind, seed=SEED, examples=EXAMPLES, steps=STEPS)


@pytest.fixture
def gworld(tmp_path):
    g = GatewayWorld(tmp_path, str(tmp_path / "client.db"))
    yield g
    g.close()


def _send(g: GatewayWorld, n: int) -> None:
    for i in range(n):
        answer = g.call("openai", "acme", f"request {i}", "2h", callback=True)
        assert answer.status_code == 202, answer.text
        g.sent[answer.json()["id"]] = Sent("acme", "openai", f"request {i}", True)


def test_a_flush_is_done_only_once_its_job_has_no_batch_out(gworld):
    # Found by the simulation (PostgreSQL, seed 12): a flush was done once its requests were
    # recorded, and only running flushes' jobs are ticked. A batch left behind at the deadline
    # cut-over (asked to cancel; its requests taken back, and failed, past the deadline)
    # was never polled again: `submitted` for ever, what it ran paid for and never booked.
    _send(gworld, 3)
    clock = gworld.world.clock
    clock.advance(600)  # the flush's age
    gworld.collect()  # flushed, loaded, its batch sent; the provider does not get to it
    clock.advance(2 * 3600)  # past the 2 h deadline
    gworld.collect()  # cut over: the batch is asked to cancel
    clock.advance(600)  # past the cut batch's grace (a third of the 10 minutes' margin)
    for _ in range(3):
        gworld.collect()  # its requests are taken back, failed past the deadline, and recorded
    with gworld.world.store.read() as conn:
        assert sorted(conn.scalars(sa.select(gateway_requests.c.state))) == ["failed"] * 3  # the deadline passed
        assert conn.scalars(sa.select(dispatches.c.state)).all() == ["submitted"]  # still out at the provider
    for _ in range(6):
        gworld.round(600)
        assert check_step(gworld) == []
    with gworld.world.store.read() as conn:
        assert conn.scalars(sa.select(dispatches.c.state)).all() == ["ended"]
        assert conn.scalars(sa.select(gateway_flushes.c.state)).all() == ["done"]
        assert sorted(conn.scalars(sa.select(gateway_requests.c.delivery))) == ["delivered"] * 3
    assert check_drained(gworld) == []
