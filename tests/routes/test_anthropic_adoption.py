"""anthropic-batch after a lost create (issue 27 item 4), against `lowtide serve` with the
official SDK on both sides: another client's batch of the dispatch's size, created in its
window on the same key, is never adopted, polled or cancelled; the dispatch's own batch is
adopted once it has ended and its results prove it, and is not created a second time."""

from __future__ import annotations

import asyncio
import time

import anthropic
import sqlalchemy as sa
import yaml

from lowtide.core.clock import ManualClock
from lowtide.core.endpoints import MESSAGES
from lowtide.core.types import Request
from lowtide.engine.control import cancel_job
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.routes.anthropic.batch import AnthropicBatchRoute
from lowtide.store.schema import dispatches, events, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import _options, _run

BODY = {"model": "claude-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
OURS = ["T1000", "T1001", "T1002"]
# Another store's job over some of the same tickets: two custom_ids in common, one not.
THEIRS = ["T1000", "T1001", "X-7"]


def _their_client(url: str) -> anthropic.AsyncAnthropic:
    """Another client on the same key (any key is taken by serve), SDK at its defaults."""
    return anthropic.AsyncAnthropic(base_url=url, api_key="test-key")


async def _their_batch(client: anthropic.AsyncAnthropic) -> str:
    batch = await client.messages.batches.create(requests=[{"custom_id": c, "params": BODY} for c in THEIRS])
    return batch.id


async def _ended(client: anthropic.AsyncAnthropic, batch_id: str) -> None:
    """Until the provider says the batch ended (a condition at another process, bounded)."""
    for _ in range(600):
        if (await client.messages.batches.retrieve(batch_id)).processing_status == "ended":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"batch {batch_id} did not end")


def _our_create_fails(serve, store, tmp_path, *serve_args: str) -> tuple[str, ManualClock, anthropic.AsyncAnthropic]:
    """serve on real time whose first create answers 500 (it may or may not have landed), our
    job of three tickets loaded on anthropic-batch there, and another client on the key."""
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"http": [{"match": "POST /v1/messages/batches", "first": 1, "status": 500}]}))
    url = serve("--time-scale", "1", *serve_args, "--faults", str(plan))
    options = _options("anthropic-batch", url, find_window=600)
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3)), route="anthropic-batch", route_options=options)
    clock = ManualClock(time.time())
    load_job(store, spec, clock)
    return url, clock, _their_client(url)


def test_another_stores_running_batch_of_our_size_is_neither_adopted_nor_cancelled(serve, store, tmp_path):
    """Our create gets a 500 (it may or may not have landed); another store then creates a
    batch of the same size on the key. The next ticks must wait rather than adopt it, and a
    `lowtide cancel` of our job must not cancel it. (At f117c17 the second tick adopted it.)"""
    # Real time, so the provider's creation times are ours; batches held running for an hour.
    url, clock, client = _our_create_fails(serve, store, tmp_path, "--complete-after", "3600")

    async def scenario() -> str:
        async with Engine(store, clock) as engine:
            assert (await engine.tick("tickets")).submitted == 0  # the create answered 500
            theirs = await _their_batch(client)
            clock.advance(1)
            assert (await engine.tick("tickets")).submitted == 0  # found theirs, running: waits
            cancel_job(store, "tickets", clock)
            clock.advance(1)
            await engine.tick("tickets")  # the cancel waits for the same reason
            return theirs

    theirs = asyncio.run(scenario())
    batch = asyncio.run(client.messages.batches.retrieve(theirs))
    assert batch.processing_status == "in_progress" and batch.cancel_initiated_at is None  # not cancelled by us
    assert [b.id for b in anthropic.Anthropic(base_url=url, api_key="k").messages.batches.list()] == [theirs]
    with store.begin() as conn:
        state, provider_id = conn.execute(sa.select(dispatches.c.state, dispatches.c.provider_id)).one()
        said = conn.scalars(sa.select(events.c.message).where(events.c.kind == "find_error")).all()
    assert (state, provider_id) == ("submitting", None)  # neither adopted nor sent again
    assert said and all(theirs in s and "another client's" in s for s in said)


def test_a_lost_create_is_sent_again_only_when_every_candidate_is_anothers_and_then_adopted(serve):
    """With only the other client's (ended) batch in the window, `find` proves ours never
    arrived; once ours is sent and its answer lost, `find` picks it out beside theirs by
    the custom_ids in the results (at f117c17 there was no such proof: it took any batch of
    the size, and refused to choose between two)."""
    url = serve("--time-scale", "1")
    route = AnthropicBatchRoute(_options("anthropic-batch", url, find_window=600))
    client = _their_client(url)
    requests = [Request(c, MESSAGES, dict(BODY)) for c in OURS]

    async def scenario() -> tuple[str | None, str, str, str | None]:
        try:
            not_before = time.time()
            theirs = await _their_batch(client)
            await _ended(client, theirs)
            before = await route.find("lt-1-a", 3, not_before, sent=OURS)  # None: send again
            ours = await route.submit("lt-1-a", requests)  # ... and that create's answer is lost
            await _ended(client, ours)
            return before, theirs, ours, await route.find("lt-1-a", 3, not_before, sent=OURS)
        finally:
            await route.aclose()

    before, theirs, ours, adopted = asyncio.run(scenario())
    assert before is None
    assert adopted == ours != theirs
    assert {b.id for b in anthropic.Anthropic(base_url=url, api_key="k").messages.batches.list()} == {theirs, ours}



def test_a_lost_create_beside_another_stores_ended_batch_runs_on_a_batch_of_its_own(serve, store, tmp_path):
    """Our create gets a 500; another store's batch of our size, sharing two custom_ids with
    ours, is created in our window and ends. `find` proves ours never arrived (theirs holds
    X-7), so the chunk is sent again: the answers are our own, theirs is left alone. (At
    f117c17 theirs was adopted: T1000 and T1001 took its answers.)"""
    url, clock, client = _our_create_fails(serve, store, tmp_path)

    async def first_tick() -> str:
        async with Engine(store, clock) as engine:
            assert (await engine.tick("tickets")).submitted == 0  # the create answered 500
        theirs = await _their_batch(client)
        await _ended(client, theirs)
        return theirs

    theirs = asyncio.run(first_tick())
    assert _run(store, "tickets").counts == {"succeeded": 3}
    with store.begin() as conn:
        outputs = dict(conn.execute(sa.select(requests.c.custom_id, requests.c.output)).all())
    assert outputs["T1000"] == "Ticket: ticket 1000 about billing"  # our own request's echo, not theirs ("hi")
    listed = anthropic.Anthropic(base_url=url, api_key="k").messages.batches.list()
    assert theirs in {b.id for b in listed.data} and len(listed.data) == 2  # theirs, and one of ours
    assert all(b.cancel_initiated_at is None for b in listed.data)
