"""The simulation's findings 3 and 4 on the issue-30 routes (docs/simulation.md), each
pinned in the simulation's own world (tests/sim/world.py: the real engine and store,
`lowtide serve` in this process, one ManualClock):

- a standing queue limit smaller than one request: once a lone request is refused, every
  request as big fails at once, naming its size, the limit and the fix; not one batch and
  one poll per request (engine/queue_limit.py);
- the provider refuses the key while lowtide looks for a batch it may have created: the
  dispatch is held, said once (an event, `lowtide status`), not re-sent; the hold ends
  when the key works again, or by a cancel (engine/held.py)."""

from __future__ import annotations

import sqlalchemy as sa

from lowtide.engine import overview
from lowtide.engine.batches import SUBMIT_LEASE
from lowtide.engine.control import cancel_job
from lowtide.engine.retention import prune
from lowtide.server.faults import FaultPlan
from lowtide.store.schema import attempts
from tests.engine.sim_world import (
    attention,
    dispatch_rows,
    event_rows,
    job_state,
    load,
    request_rows,
    rounds,
    world,
)
from tests.sim import invariants
from tests.sim.machine import fault_plan
from tests.sim.world import KEY, WRONG_KEY_ENV, KillPoint


def test_requests_a_queue_cannot_hold_fail_at_once_not_one_batch_each(tmp_path):
    with world(tmp_path) as w:
        w.set_faults(FaultPlan.model_validate({"enqueued_tokens": {"*": 1}}))  # not one request fits
        load(w, "openai-compatible-batch", rows=20, chunk=4)
        rounds(w, 12)
        rows = request_rows(w)
        assert [r.state for r in rows] == ["failed"] * 20
        assert {r.error_code for r in rows} == {"over_token_limit"}
        made = invariants.batches_created(w)
        sizes = [(d.size, d.state, d.error and d.error[:60]) for d in dispatch_rows(w)]
        assert made <= 8, sizes  # halved down to one request, refused alone: the rest never sent (it was 20 and more)
        unsent = [r.error_message for r in rows if r.attempts == 0]
        assert len(unsent) >= 12, sizes
        assert all("input tokens, over the at most" in m and "refused alone" in m and "shorten the request" in m for m in unsent)
        assert invariants.request_states(w) + invariants.created_once(w) + invariants.bill_matches(w, drained=True) == []


def _held_world(w, monkeypatch, deadline: float | None = None):
    """Job a on azure-batch with a key the provider refuses: the first create is refused
    (401: its two requests fail), and the worker dies just before the second, leaving it
    `submitting`: nothing proves it was not sent."""
    monkeypatch.setenv(WRONG_KEY_ENV, "not-the-key")
    load(w, "azure-batch", rows=4, chunk=2, key_env=WRONG_KEY_ENV, deadline=deadline)
    assert w.tick_killed(KillPoint(2, after=False))
    [submitting] = [d for d in dispatch_rows(w) if d.state == "submitting"]
    w.clock.advance(SUBMIT_LEASE)  # the dead worker's lease on it runs out (it ran in this process)
    return submitting


def test_a_find_refused_the_key_holds_the_dispatch_and_says_so_once(tmp_path, monkeypatch):
    with world(tmp_path) as w:
        held = _held_world(w, monkeypatch)
        rounds(w, 6)
        [again] = [d for d in dispatch_rows(w) if d.id == held.id]
        assert again.state == "submitting" and again.error.startswith("held: the provider refused the key while looking")
        assert held.key in again.error and "LOWTIDE_SIM_WRONG_KEY" in again.error and "lowtide cancel a" in again.error
        assert len(event_rows(w, "held")) == 1  # once, not once a tick
        assert event_rows(w, "find_error") == []
        said = attention(w.store, "a", w.clock)
        assert len(said) == 1 and said[0] == again.error
        assert invariants.batches_created(w) == 0  # the refused create made none; nothing sent again blindly

        monkeypatch.setenv(WRONG_KEY_ENV, KEY)  # the operator fixes the key where the worker runs
        w.run(w.engine.aclose())
        w.engine = w._new_engine()
        rounds(w, 8)
        states = sorted((r.state, r.error_code or "") for r in request_rows(w))
        assert states == [("failed", "batch_rejected")] * 2 + [("succeeded", "")] * 2
        assert job_state(w) == "finished" and attention(w.store, "a", w.clock) == []


def test_a_cancel_ends_a_held_dispatch_its_requests_cancelled(tmp_path, monkeypatch):
    with world(tmp_path) as w:
        held = _held_world(w, monkeypatch)
        rounds(w, 2)
        cancel_job(w.store, "a", w.clock)
        rounds(w, 2)
        with w.store.read() as conn:
            state = conn.execute(sa.text("select state from dispatches where id = :i"), {"i": held.id}).scalar_one()
        assert state == "failed"
        rows = request_rows(w)
        assert sorted(r.state for r in rows) == ["cancelled", "cancelled", "failed", "failed"]
        assert all("cannot tell whether that batch was created" in r.error_message for r in rows if r.state == "cancelled")
        assert job_state(w) == "cancelled" and attention(w.store, "a", w.clock) == []


def test_a_held_dispatch_is_given_up_when_the_deadline_comes(tmp_path, monkeypatch):
    with world(tmp_path) as w:
        deadline = w.clock.now() + 7200
        held = _held_world(w, monkeypatch, deadline)
        rounds(w, 2)
        assert len(event_rows(w, "held")) == 1
        w.clock.advance(deadline - w.clock.now())
        rounds(w, 3)
        [ended] = [d for d in dispatch_rows(w) if d.id == held.id]
        assert ended.state == "failed" and "given up as the job's deadline came" in ended.error
        # batch_lost, retryable: another batch while attempts remain, but past the deadline nothing is sent
        assert sorted((r.state, r.error_code) for r in request_rows(w)) == [
            ("failed", "batch_rejected"), ("failed", "batch_rejected"), ("failed", "deadline_passed"), ("failed", "deadline_passed")
        ]  # fmt: skip
        # They were sent (in the held batch), so not "before this request was sent": the last attempt is named.
        late = [r.error_message for r in request_rows(w) if r.error_code == "deadline_passed"]
        assert all("before this request could be sent again" in m and "its last attempt: batch_lost: " in m for m in late), late
        assert all("refused the key while lowtide looked for batch" in m for m in late), late
        assert job_state(w) == "finished" and invariants.batches_created(w) == 0


def test_a_cancel_leaves_no_request_held_by_a_dead_workers_direct_dispatch(tmp_path):
    """The simulation's seed 5001 on echo (`bench/simulate.py --route echo --seed 5001`): a
    worker dies holding a direct dispatch, and the job is cancelled before the dispatch's
    lease runs out. Its requests are cancelled then; none may still name the dispatch,
    which stays running (its worker may be alive elsewhere) until the lease ends it."""
    with world(tmp_path) as w:
        load(w, "echo", rows=3, chunk=2)
        assert w.tick_killed(KillPoint(1, after=False))
        [running] = [d for d in dispatch_rows(w) if d.state == "running"]
        cancel_job(w.store, "a", w.clock)
        assert invariants.request_states(w) == []
        assert [d.state for d in dispatch_rows(w) if d.id == running.id] == ["running"]
        rounds(w, 3)  # the lease runs out: the dispatch is given up, nothing in it
        assert [d.state for d in dispatch_rows(w) if d.id == running.id] == ["abandoned"]
        assert [r.state for r in request_rows(w)] == ["cancelled"] * 3
        assert job_state(w) == "cancelled" and invariants.request_states(w) == []


def test_a_day_without_polls_is_not_a_day_of_failed_polls(tmp_path):
    """The simulation's seed 7002 on vertex-batch and gemini-batch: a poll fails, the worker
    is away for a day (the clock moves 25 h), and its next poll fails too. That is two failed
    polls, not a day of them: the batch, which ran and was billed, must not be given up as
    lost; polled on, its results are booked once the provider answers again."""
    with world(tmp_path) as w:
        load(w, "gemini-batch", rows=2, chunk=2)
        w.tick()
        [sent] = dispatch_rows(w)
        assert sent.state == "submitted"
        w.set_faults(fault_plan("poll_500", "gemini-batch", {}))  # its next three polls answer 500 (the SDK tries each once)
        w.clock.advance(600)
        w.tick()
        w.clock.advance(25 * 3600)  # nobody polls for a day
        w.tick()
        assert len(event_rows(w, "poll_error")) == 2
        assert [d.state for d in dispatch_rows(w)] == ["submitted"]
        rounds(w, 6, seconds=600)
        assert [d.state for d in dispatch_rows(w)] == ["ended"]
        assert [r.state for r in request_rows(w)] == ["succeeded"] * 2
        assert invariants.bill_matches(w, drained=True) == []


def _given_up_as_lost(w):
    """Job a's first batch on openai-batch, for which the provider answers 404 during two
    hours of polls: given up as lost, its requests sent again in another batch."""
    load(w, "openai-batch", rows=2, chunk=2)
    w.tick()
    [first] = dispatch_rows(w)
    w.set_faults(FaultPlan.model_validate({"http": [{"match": f"GET /v1/batches/{first.provider_id}", "status": 404}]}))
    rounds(w, 12, seconds=600)
    lost = dispatch_rows(w)[0]
    assert lost.state == "failed" and "given up as lost" in lost.error
    return first


def test_a_batch_given_up_as_lost_that_ran_after_all_is_booked(tmp_path):
    """The provider answers 404 for a batch (it does not know it yet, or forgot it for a
    while) for over an hour of polls: the batch is given up as lost and its requests sent
    again. It ran all the same and was billed. Polled on (engine/batches.py `_watch`), it is
    read once the provider knows it again: each of its billed lines booked once, nothing
    applied (the requests' answers are the second batch's)."""
    with world(tmp_path) as w:
        first = _given_up_as_lost(w)
        w.set_faults(FaultPlan())  # the provider knows it again
        rounds(w, 12, seconds=600)
        assert [r.state for r in request_rows(w)] == ["succeeded"] * 2
        assert [d.state for d in dispatch_rows(w)] == ["failed", "ended"]
        assert invariants.bill_matches(w, drained=True) == []
        assert len(event_rows(w, "lost_batch_booked")) == 1
        with w.store.read() as conn:
            late = conn.execute(sa.select(attempts.c.applied, attempts.c.billed).where(attempts.c.dispatch_id == first.id)).all()
        assert sorted(late) == [(True, True)] * 2  # the given-up attempts (which moved the requests on), now billed
        rounds(w, 4, seconds=6 * 3600)  # read once: never booked again, nor polled on
        assert invariants.bill_matches(w, drained=True) == [] and len(event_rows(w, "lost_batch_booked")) == 1


def test_a_lost_batch_never_answered_is_watched_for_two_days_then_said_unread(tmp_path):
    """The watch is bounded: a batch the provider never knows again is polled for WATCH, then
    the watch ends, said once (what the provider may have billed is not booked)."""
    with world(tmp_path) as w:
        first = _given_up_as_lost(w)
        assert dispatch_rows(w)[0].watch_until is not None and job_state(w) == "finished"
        [said] = attention(w.store, "a", w.clock)  # `lowtide status`: the job is finished, its lost batch still watched
        assert first.provider_id in said and "still polled for what the provider bills" in said and "keep a worker" in said
        with w.store.read() as conn:  # the dashboard's batch timeline
            shown = {b["provider_id"]: b["watch_until"] for b in overview.batch_timeline(conn, first.job_id)[1]}
        assert shown[first.provider_id] == dispatch_rows(w)[0].watch_until and list(shown.values()).count(None) == 1
        rounds(w, 12, seconds=6 * 3600)  # three days
        assert dispatch_rows(w)[0].watch_until is None and attention(w.store, "a", w.clock) == []
        assert len(event_rows(w, "lost_batch_unread")) == 1 and event_rows(w, "lost_batch_booked") == []


def test_pruning_the_job_of_a_watched_batch_still_books_its_bill(tmp_path):
    """`lowtide prune` drops a finished job's bodies, not its ledger: a batch given up as lost
    and watched is still booked after its job was pruned (the booking reads requests by
    custom_id and writes attempts, neither of which prune drops)."""
    with world(tmp_path) as w:
        _given_up_as_lost(w)
        assert job_state(w) == "finished"
        assert prune(w.store, w.clock, older_than_s=0).jobs == ["a"]
        w.set_faults(FaultPlan())  # the provider knows the batch again
        rounds(w, 4, seconds=600)
        assert len(event_rows(w, "lost_batch_booked")) == 1
        assert invariants.bill_matches(w, drained=True) == []


def test_moving_the_route_ends_the_watch_of_a_lost_batch(tmp_path):
    """The simulation's seed 27 on openai-compatible-batch: a batch given up as lost lives
    where it was sent. A load that moves the route elsewhere (allowed: nothing is in flight)
    ends its watch, said once, rather than polling the new place, which never knows it."""
    with world(tmp_path) as w:
        first = _given_up_as_lost(w)
        assert dispatch_rows(w)[0].watch_until is not None
        elsewhere = w.route_options("openai-batch", 2, "other")
        load(w, "openai-batch", rows=2, chunk=2, base_url=elsewhere["base_url"])
        assert dispatch_rows(w)[0].watch_until is None
        [said] = event_rows(w, "lost_batch_unread")
        assert first.provider_id in said and "moved its route" in said
