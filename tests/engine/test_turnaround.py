"""Measured turnarounds are kept per route, model and service tier: flex work on `openai`
is not read as real time's, nor the other way round (engine/turnaround.py). The dispatches
are the store's own: written by a real job against a loopback OpenAI-compatible server, or
inserted as an earlier job's history."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from lowtide.core.pricing import PRICES_ENV
from lowtide.engine import turnaround
from lowtide.engine.control import job_status
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.schema import dispatches, jobs
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.engine.test_tiers import MODEL, PRICES
from tests.routes.upstream import Upstream
from tests.sqlite_steps import sqlite_steps

FLEX = {"service_tier": "flex"}


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789abcdef")
    (tmp_path / "prices.yaml").write_text(PRICES)
    monkeypatch.setenv(PRICES_ENV, str(tmp_path / "prices.yaml"))


def _history(store, per_request: dict[str | None, float], n: int = 3, job: str = "earlier") -> None:
    """An earlier job's `n` ended direct dispatches of 10 requests on `openai` per tier, each
    taking `per_request` seconds a request."""
    with store.begin() as conn:
        job_id = conn.execute(
            sa.insert(jobs).values(name=job, spec="{}", route="openai", state="finished", created_at=0, updated_at=0)
        ).inserted_primary_key[0]
        for tier, seconds in per_request.items():
            for i in range(n):
                conn.execute(sa.insert(dispatches).values(
                    job_id=job_id, route="openai", kind="direct", key=f"{job}-{tier}-{i}", state="ended", size=10,
                    polls=0, cancel_requested=False, created_at=1000, ended_at=1000 + 10 * seconds, model=MODEL, tier=tier,
                ))  # fmt: skip


def _expected(store, options: dict) -> turnaround.Turnaround:
    with store.begin() as conn:
        return turnaround.expected(conn, "openai", options, MODEL, "direct", 100)


def test_flex_and_real_time_are_measured_apart(store):
    _history(store, {None: 0.1, "flex": 5.0})
    real_time, flex = _expected(store, {}), _expected(store, FLEX)
    assert (real_time.p95, real_time.basis) == (pytest.approx(10.0), "measured: 3 dispatches")
    assert (flex.p95, flex.basis) == (pytest.approx(500.0), "measured: 3 dispatches")


def test_a_tier_with_no_measurements_of_its_own_keeps_its_prior(store):
    _history(store, {None: 0.1})  # fast real-time work says nothing about flex
    flex = _expected(store, FLEX)
    assert flex.basis.startswith("prior: flex:") and flex.p95 == pytest.approx(100 * turnaround.PRIORS["openai:flex"].p95)
    _history(store, {"flex": 5.0}, job="later")
    assert _expected(store, {}).p95 == pytest.approx(10.0)  # ... nor slow flex work about real time


def test_a_direct_job_records_the_tier_it_asked_for(store, clock, tmp_path):
    with Upstream() as upstream:
        wire = {"base_url": f"{upstream.url}/v1", "max_retries": 0, "dispatch_size": 4}
        for name, options in (("flex-job", FLEX), ("real-time-job", {})):
            source = write_csv(tmp_path / f"{name}.csv", ticket_rows(8))
            load_job(store, make_spec(source, name=name, model=MODEL, route="openai", route_options=wire | options), clock)

        async def run() -> None:
            engine = Engine(store, clock, seed=3)
            for _ in range(4):
                for name in ("flex-job", "real-time-job"):
                    await engine.tick(name)
                clock.advance(1)
            await engine.aclose()

        asyncio.run(run())
    assert job_status(store, "flex-job").counts == job_status(store, "real-time-job").counts == {"succeeded": 8}
    with store.begin() as conn:
        tiers = conn.execute(
            sa.select(jobs.c.name, dispatches.c.tier, sa.func.count()).join(jobs, jobs.c.id == dispatches.c.job_id)
            .group_by(jobs.c.name, dispatches.c.tier).order_by(jobs.c.name)
        ).all()  # fmt: skip
    assert [tuple(t) for t in tiers] == [("flex-job", "flex", 2), ("real-time-job", None, 2)]


def test_a_batch_route_reads_its_batches_whatever_service_tier_its_options_name(store):
    # batch dispatches keep no tier: options naming one must not hide their measured batches
    with store.begin() as conn:
        job_id = conn.execute(
            sa.insert(jobs).values(name="earlier", spec="{}", route="openai-batch", state="finished", created_at=0, updated_at=0)
        ).inserted_primary_key[0]
        for i in range(3):
            conn.execute(sa.insert(dispatches).values(
                job_id=job_id, route="openai-batch", kind="batch", key=f"b{i}", state="ended", size=10, polls=1,
                cancel_requested=False, created_at=0, submitted_at=1000, ended_at=1000 + 600 * (i + 1), model=MODEL,
            ))  # fmt: skip
        took = turnaround.expected(conn, "openai-batch", {"service_tier": "flex"}, MODEL, "batch", 100)
    assert (took.p95, took.basis) == (1800, "measured: 3 batches")


def _many(store, job: str, n: int, **values) -> None:
    """`n` ended dispatches of an earlier job, inserted at once."""
    with store.begin() as conn:
        job_id = conn.execute(
            sa.insert(jobs).values(name=job, spec="{}", route="openai", state="finished", created_at=0, updated_at=0)
        ).inserted_primary_key[0]
        row = {"job_id": job_id, "route": "openai", "kind": "direct", "state": "ended", "size": 10, "polls": 0,
               "cancel_requested": False, "created_at": 1000, "model": MODEL} | values  # fmt: skip
        conn.execute(sa.insert(dispatches), [{**row, "key": f"{job}-{i}", "ended_at": 1000 + i} for i in range(n)])


def test_a_tick_reads_a_tiers_recent_turnarounds_without_reading_the_stores_history(sqlite_store):
    """Each tick of a chain reads each tier's turnaround: off the index of dispatches by
    route, model, kind, tier and state, the newest 50 ended, whatever else the store holds
    (other routes, tiers, kinds, and older dispatches of the same)."""
    cost = {}
    for name, n in (("small", 100), ("large", 3000)):
        _many(sqlite_store, f"{name}-same", n)
        _many(sqlite_store, f"{name}-flex", n, tier="flex")
        _many(sqlite_store, f"{name}-batch", n, kind="batch", submitted_at=1000)
        _many(sqlite_store, f"{name}-other", n, route="anthropic")
        _expected(sqlite_store, {})  # statements prepared once
        with sqlite_steps(sqlite_store) as steps:
            took = _expected(sqlite_store, {})
        assert took.basis == "measured: 50 dispatches"
        cost[name] = steps[0]
    # Without the index, every dispatch was read and the newest sorted out: 30 times more.
    assert cost["large"] <= cost["small"] + 20, cost
