"""A provider's full batch queue (OpenAI's enqueued-token limit, through `lowtide serve`'s
fault plan and the official SDK) never leaves a request without a way to a terminal state:
refused with nothing in flight, lowtide learns a smaller batch instead of sending the same
one for ever; a request the queue cannot hold alone fails with the provider's words; a
cancel that meets a refusal cancels; and a held model does not spin the loop (issue 27)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import sqlalchemy as sa
import yaml

from lowtide.core.clock import ManualClock, SystemClock
from lowtide.engine.control import cancel_job
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.schema import dispatches, events, requests
from tests.conftest import make_spec, ticket_rows, wait_until, write_csv
from tests.routes.conftest import _options, _run
from tests.routes.test_queue_limit import CHUNK, ROWS, _body_tokens

ONE_ROW = _body_tokens(make_spec(Path("unused.csv"))) // CHUNK  # serve's tokens for one request


def _start(serve, tmp_path, limit: int, *extra: str) -> str:
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"enqueued_tokens": {"*": limit}}))
    return serve("--faults", str(plan), *extra)


def _load(tmp_path, url: str, clock=None, rows: int = ROWS, **route_options) -> Store:
    source = write_csv(tmp_path / "t.csv", ticket_rows(rows))
    spec = make_spec(source, route="openai-batch", route_options=_options("openai-batch", url, **route_options),
                     retry={"max_attempts": 1, "backoff_seconds": 0})  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, clock or SystemClock())
    return store


def _batches(store: Store) -> list:
    with store.begin() as conn:
        return conn.execute(
            sa.select(dispatches.c.state, dispatches.c.size, dispatches.c.provider_id, dispatches.c.error).order_by(dispatches.c.id)
        ).all()  # fmt: skip


def test_a_refusal_with_nothing_in_flight_sends_smaller_batches_not_the_same_one_again(serve, tmp_path):
    # No limit told to lowtide, and the provider's queue holds three requests: the first chunk
    # (all twelve) is refused with nothing else in flight. It used to be sent again for ever.
    url = _start(serve, tmp_path, limit=3 * ONE_ROW + ONE_ROW // 2)
    store = _load(tmp_path, url)
    status = _run(store, "tickets", timeout=120)
    assert status.counts == {"succeeded": ROWS}, status.events
    batches = _batches(store)
    refused = [b for b in batches if b.state == "failed"]
    assert refused and all(b.error.startswith("token_limit_exceeded") for b in refused)
    assert [b.size for b in refused] == sorted((b.size for b in refused), reverse=True)  # each refusal: a smaller batch
    assert len(batches) <= 8  # 12 refused, 6 refused, then batches of 3: not a loop
    with store.begin() as conn:
        tries = conn.execute(sa.select(requests.c.attempts)).scalars().all()
        said = conn.execute(sa.select(events.c.message).where(events.c.kind == "queue_full")).scalars().all()
    assert tries == [1] * ROWS  # a refusal for the queue is nobody's attempt
    assert any("with nothing else in flight" in s and "its limit is taken as about" in s for s in said)


def test_a_request_the_queue_cannot_hold_alone_fails_with_the_providers_words(serve, tmp_path):
    url = _start(serve, tmp_path, limit=ONE_ROW // 2)  # not even one request fits
    store = _load(tmp_path, url, rows=4)
    status = _run(store, "tickets", timeout=120)
    assert status.counts == {"failed": 4} and status.failures == {"over_token_limit": 4}
    with store.begin() as conn:
        message = conn.execute(sa.select(requests.c.error_message).limit(1)).scalar_one()
    assert "nothing else of test-model in flight" in message and "Enqueued token limit reached" in message
    assert len(_batches(store)) <= 2 + 4  # halved down to one, then each request alone once


def _serve_status(url: str, provider_id: str) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="test-key")
    return client.batches.retrieve(provider_id).status


def _first_tick_meets_a_full_queue(serve, tmp_path, clock, complete_after: str = "7200") -> tuple[str, Store]:
    """Two batches of four go out on the first tick; the provider's queue holds one and a
    half: the second is refused. Returns once the provider has refused it. The first stays
    in progress `complete_after` scaled seconds (7200: 2 s)."""
    url = _start(serve, tmp_path, CHUNK * ONE_ROW * 3 // 2, "--complete-after", complete_after)
    store = _load(tmp_path, url, clock, max_requests=CHUNK)

    async def tick():
        async with Engine(store, clock) as engine:
            await engine.tick("tickets")

    asyncio.run(tick())
    second = _batches(store)[1].provider_id
    wait_until(lambda: _serve_status(url, second) == "failed", what="the provider to refuse the second batch")
    return url, store


def test_a_cancel_that_meets_a_full_queue_cancels_the_requests_it_gave_back(serve, tmp_path):
    url, store = _first_tick_meets_a_full_queue(serve, tmp_path, SystemClock())
    cancel_job(store, "tickets", SystemClock())
    status = _run(store, "tickets", timeout=120)
    # The refused batch's requests were given back after the cancel: cancelled, never pending in a job nobody ticks.
    assert "pending" not in status.counts, status.counts
    assert set(status.counts) <= {"cancelled", "succeeded"} and sum(status.counts.values()) == ROWS


def test_a_model_held_by_a_full_queue_does_not_spin_the_loop(serve, tmp_path):
    clock = ManualClock(SystemClock().now())
    # The first batch in progress for 20 s: the ticks below must not meet it ended (under a
    # full test run, 2 s had passed by the second tick once, and it ingested 4 answers).
    url, store = _first_tick_meets_a_full_queue(serve, tmp_path, clock, complete_after="72000")

    async def go():
        async with Engine(store, clock) as engine:
            clock.advance(1)
            report = await engine.tick("tickets")  # polls: the second batch's refusal is taken in
            assert report.ingested.retried == 0
            clock.advance(1)  # the given-back requests are due, but their model is held
            report = await engine.tick("tickets")
            assert not report.busy
            return engine.next_due("tickets")

    due = asyncio.run(go())
    assert _batches(store)[1].state == "failed"
    # The loop waits for the next poll of the batch in flight, not for requests it cannot send.
    assert due is not None and due > clock.now()
