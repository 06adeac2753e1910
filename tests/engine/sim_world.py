"""Helpers for engine tests that run in the simulation's world (tests/sim/world.py): the
real engine and store against `lowtide serve` in this process, on one ManualClock."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from lowtide.core.spec import build_spec
from lowtide.engine.loader import load_job
from lowtide.store.schema import dispatches, events, jobs, requests
from tests.conftest import write_csv
from tests.sim.world import KEY_ENV, ROUTE_MODELS, World


@contextlib.contextmanager
def world(root: Path, route: str | None = None) -> Iterator[World]:
    """`route`: a route whose inputs and outputs live in an object store (vertex-batch,
    bedrock-batch) gets one of its own (tests/sim/world.py `ObjectStores`)."""
    w = World(root, str(root / "client.db"), route=route)
    try:
        yield w
    finally:
        w.close()


def load(w: World, route: str, rows: int, chunk: int, key_env: str = KEY_ENV, deadline: float | None = None,
         fallback: dict[str, Any] | None = None, **options: Any) -> None:  # fmt: skip
    """Job `a` of `rows` tickets on `route` at the main provider, `chunk` requests a batch;
    `deadline` on the world's clock; `fallback` its `fallback:` (World.fallback)."""
    source = write_csv(w.root / "a.csv", [{"ticket_id": f"a-{i}", "body": f"ticket {i} of a"} for i in range(rows)])
    spec = build_spec({
        "name": "a", "source": {"path": str(source), "id_column": "ticket_id"}, "template": {"user": "Ticket: {{ body }}"},
        "model": ROUTE_MODELS[route], "route": route, "params": {"max_tokens": 64},
        "route_options": w.route_options(route, chunk, "main", key_env) | options,
        "retry": {"max_attempts": 3, "backoff_seconds": 30},
    } | ({"deadline": datetime.fromtimestamp(deadline, UTC).isoformat()} if deadline is not None else {})
      | ({"fallback": fallback} if fallback is not None else {}))  # fmt: skip
    load_job(w.store, spec, w.clock)


def rounds(w: World, n: int, seconds: float = 60.0) -> None:
    """`n` rounds of a tick, the provider's step and the clock moving on."""
    for _ in range(n):
        w.tick()
        w.serve_step()
        w.clock.advance(seconds)


def request_rows(w: World) -> list:
    with w.store.read() as conn:
        return conn.execute(sa.select(requests.c.state, requests.c.error_code, requests.c.error_message, requests.c.attempts)).all()


def dispatch_rows(w: World) -> list:
    with w.store.read() as conn:
        return conn.execute(sa.select(dispatches).order_by(dispatches.c.id)).all()


def event_rows(w: World, kind: str) -> list[str]:
    with w.store.read() as conn:
        return list(conn.scalars(sa.select(events.c.message).where(events.c.kind == kind).order_by(events.c.id)))


def job_state(w: World) -> str:
    with w.store.read() as conn:
        return conn.execute(sa.select(jobs.c.state).where(jobs.c.name == "a")).scalar_one()


def attention(store, name, clock) -> list[str]:
    # Imported here: the defect tests run on the commits before engine/attention.py too.
    from lowtide.engine.attention import attention

    return attention(store, name, clock)
