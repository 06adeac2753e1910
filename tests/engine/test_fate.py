"""Exits a request once had no way through (issue 27), each on its own path: a deadline
that passes while batches are planned, a batch the provider forgets, a create that never
left against a provider that is down, and retries scattered into one-request batches.
The engine runs on a ManualClock; the provider is echo-batch (a folder) or nothing at all."""

from __future__ import annotations

import asyncio
import shutil
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from lowtide.core.clock import ManualClock
from lowtide.engine.control import cancel_job, job_done, job_status
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.schema import dispatches, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import KEY_ENV


def _ticks(store, clock: ManualClock, n: int, step: float = 5.0, name: str = "tickets") -> None:
    async def go():
        async with Engine(store, clock, seed=1) as engine:
            for _ in range(n):
                await engine.tick(name)
                if job_done(store, name):
                    return
                clock.advance(step)

    asyncio.run(go())


def _echo_job(tmp_path, rows: int, **overrides):
    source = write_csv(tmp_path / "t.csv", ticket_rows(rows))
    options = {"dir": str(tmp_path / "provider"), **overrides.pop("route_options", {})}
    return make_spec(source, route="echo-batch", route_options=options, **overrides)


def test_batches_planned_before_the_deadline_are_not_sent_after_it(sqlite_store, clock, tmp_path):
    deadline = clock.now() + 100
    spec = _echo_job(tmp_path, 60, chunk_size=10, deadline=datetime.fromtimestamp(deadline, UTC).isoformat(),
                     route_options={"polls_to_complete": 100})  # fmt: skip
    load_job(sqlite_store, spec, clock)
    _ticks(sqlite_store, clock, 2, step=10)  # six chunks planned, four of them sent (two a tick)
    with sqlite_store.begin() as conn:
        planned = conn.execute(sa.select(sa.func.count()).select_from(dispatches).where(dispatches.c.state == "planned")).scalar_one()
    assert planned == 2
    clock.advance(200)  # past the deadline
    _ticks(sqlite_store, clock, 1)
    with sqlite_store.begin() as conn:
        sent_late = conn.execute(
            sa.select(sa.func.count()).select_from(dispatches).where(dispatches.c.submitted_at >= deadline)
        ).scalar_one()
        failed = conn.execute(
            sa.select(sa.func.count()).select_from(requests).where(requests.c.error_code == "deadline_passed")
        ).scalar_one()
    assert sent_late == 0
    assert failed == 20  # the two planned chunks' requests: failed unsent, never paid for


def _one_batch_sent(store, clock, tmp_path) -> str:
    """A job of six rows on echo-batch, its one batch sent: the batch's id."""
    load_job(store, _echo_job(tmp_path, 6, route_options={"polls_to_complete": 3}), clock)
    _ticks(store, clock, 1)
    with store.begin() as conn:
        return conn.execute(sa.select(dispatches.c.provider_id)).scalar_one()


def test_a_batch_the_provider_no_longer_knows_is_given_up_and_its_requests_sent_again(sqlite_store, clock, tmp_path):
    first = _one_batch_sent(sqlite_store, clock, tmp_path)
    shutil.rmtree(tmp_path / "provider" / first)  # the provider lost it: every poll is now "no such batch"
    _ticks(sqlite_store, clock, 200, step=60)  # 200 minutes of polls at most
    status = job_status(sqlite_store, "tickets")
    assert status.counts == {"succeeded": 6}, status.events
    with sqlite_store.begin() as conn:
        lost = conn.execute(sa.select(dispatches.c.state, dispatches.c.error).where(dispatches.c.provider_id == first)).one()
        tries = conn.execute(sa.select(requests.c.attempts)).scalars().all()
    assert lost.state == "failed" and "given up as lost" in lost.error
    assert tries == [2] * 6  # the lost batch was an attempt; the second batch answered


def test_a_batch_the_provider_answers_only_nonsense_about_is_given_up_after_a_day(sqlite_store, clock, tmp_path):
    first = _one_batch_sent(sqlite_store, clock, tmp_path)
    (tmp_path / "provider" / first / "meta.json").write_text("<html>bad gateway")  # every poll: an error
    _ticks(sqlite_store, clock, 12, step=3600)  # half a day: still waited for (an outage is not a loss)
    assert job_status(sqlite_store, "tickets").counts == {"dispatched": 6}
    _ticks(sqlite_store, clock, 40, step=3600)
    assert job_status(sqlite_store, "tickets").counts == {"succeeded": 6}
    with sqlite_store.begin() as conn:
        lost = conn.execute(sa.select(dispatches.c.error).where(dispatches.c.provider_id == first)).scalar_one()
    assert "has answered every poll of batch" in lost and "given up as lost" in lost


@pytest.mark.parametrize(
    ("route", "model", "base_url"),
    [("openai-batch", "test-model", "http://127.0.0.1:9/v1"), ("gemini-batch", "gemini-2.5-flash", "http://127.0.0.1:9"),
     ("anthropic-batch", "claude-sonnet-4-5", "http://127.0.0.1:9")],
)
def test_cancel_while_the_provider_is_down_ends_at_once(sqlite_store, clock, tmp_path, monkeypatch, route, model, base_url):
    monkeypatch.setenv(KEY_ENV, "test-key")
    source = write_csv(tmp_path / "t.csv", ticket_rows(4))
    # Nothing listens on port 9: every connection is refused, so no create ever reached a provider.
    spec = make_spec(source, route=route, model=model, route_options={"base_url": base_url, "api_key_env": KEY_ENV})
    load_job(sqlite_store, spec, clock)
    _ticks(sqlite_store, clock, 1)
    cancel_job(sqlite_store, "tickets", clock)
    _ticks(sqlite_store, clock, 5)
    assert job_done(sqlite_store, "tickets")
    assert job_status(sqlite_store, "tickets").counts == {"cancelled": 4}
    with sqlite_store.begin() as conn:
        states = conn.execute(sa.select(dispatches.c.state)).scalars().all()
    assert states == ["cancelled"]


def test_retries_due_within_a_poll_interval_share_a_batch(sqlite_store, clock, tmp_path):
    rows = ticket_rows(40)
    # One batch of 40 whose every request fails once (retryable): 40 retries, their backoffs
    # jittered over half a second, well within echo-batch's first poll interval (1 s).
    spec = _echo_job(tmp_path, 40, chunk_size=40, retry={"max_attempts": 3, "backoff_seconds": 1},
                     route_options={"fail_attempts": {r["ticket_id"]: 1 for r in rows}})  # fmt: skip
    load_job(sqlite_store, spec, clock)
    _ticks(sqlite_store, clock, 200, step=0.1)
    assert job_status(sqlite_store, "tickets").counts == {"succeeded": 40}
    with sqlite_store.begin() as conn:
        sizes = conn.execute(sa.select(dispatches.c.size).order_by(dispatches.c.id)).scalars().all()
    assert sizes == [40, 40]  # the retries went in one batch, not one per tick as each came due


def test_cancel_force_ends_a_create_that_may_have_landed_at_a_provider_gone_quiet(sqlite_store, clock, tmp_path, monkeypatch):
    """A create that timed out may have reached the provider: lowtide waits to find it
    before it cancels. While the provider does not answer, that wait has no end; `--force`
    ends it, and the risk is written down."""
    import socket

    monkeypatch.setenv(KEY_ENV, "test-key")
    quiet = socket.create_server(("127.0.0.1", 0))  # accepts connections, never answers
    quiet.listen(64)
    try:
        source = write_csv(tmp_path / "t.csv", ticket_rows(4))
        options = {"base_url": f"http://127.0.0.1:{quiet.getsockname()[1]}/v1", "api_key_env": KEY_ENV, "timeout": 0.2}
        load_job(sqlite_store, make_spec(source, route="openai-batch", route_options=options), clock)
        _ticks(sqlite_store, clock, 1)
        with sqlite_store.begin() as conn:
            assert conn.execute(sa.select(dispatches.c.state)).scalar_one() == "submitting"  # sent? nobody can tell
        cancel_job(sqlite_store, "tickets", clock)
        _ticks(sqlite_store, clock, 2)
        assert not job_done(sqlite_store, "tickets")  # still waiting for the provider to say
        assert cancel_job(sqlite_store, "tickets", clock, force=True) == 4
        assert job_done(sqlite_store, "tickets")
        status = job_status(sqlite_store, "tickets", events=10)
        assert status.counts == {"cancelled": 4}
        assert any("cancel_forced" in e and "paid for there" in e for e in status.events)
    finally:
        quiet.close()
