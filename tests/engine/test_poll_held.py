"""Simulation finding 5 (docs/simulation.md): the key changes while a batch runs. The batch
runs and is paid for at the provider whatever lowtide's key, so a poll refused the key
(401/403) holds the dispatch, said once, polled as before; it is not given up as lost after
a day of errors (which ended its requests and sent them again: paid twice, the first
answers never read). The key fixed, the next poll reads it; a cancel gives it up, its
requests cancelled (engine/held.py `hold_poll`); a deadline cut-over does not (it asks the
batch to cancel, which is not the job cancelled): its requests go on to the fallback, and the
batch is read late, its bill booked. In the simulation's world: the real engine and store
against `lowtide serve`, on one ManualClock."""

from __future__ import annotations

from lowtide.engine.control import cancel_job
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
from tests.sim.world import KEY, START, WRONG_KEY_ENV

HOURS = 3600.0


def _sent_then_key_refused(w, monkeypatch, **spec):
    """Job a's four requests in two azure-batch batches, sent with a working key; then the
    key in the variable changes (rotated where the worker runs) and a new worker starts.
    `spec`: more of the job's spec (`load`: a deadline, a fallback)."""
    monkeypatch.setenv(WRONG_KEY_ENV, KEY)
    load(w, "azure-batch", rows=4, chunk=2, key_env=WRONG_KEY_ENV, **spec)
    w.tick()  # both sent; serve has not run them yet
    assert [d.state for d in dispatch_rows(w)] == ["submitted", "submitted"]
    monkeypatch.setenv(WRONG_KEY_ENV, "not-the-key")
    w.run(w.engine.aclose())
    w.engine = w._new_engine()


def test_a_poll_refused_the_key_holds_the_batch_past_a_day_and_reads_it_once_the_key_works(tmp_path, monkeypatch):
    with world(tmp_path) as w:
        _sent_then_key_refused(w, monkeypatch)
        rounds(w, 16, 3 * HOURS)  # two days of polls, every one refused
        held = dispatch_rows(w)
        assert [d.state for d in held] == ["submitted", "submitted"], [d.error for d in held]
        assert all(d.error.startswith("held: the provider refused the key while polling batch") for d in held)
        assert all("LOWTIDE_SIM_WRONG_KEY" in d.error and "lowtide cancel a" in d.error for d in held)
        assert len(event_rows(w, "held")) == 2 and event_rows(w, "poll_error") == []  # once a batch, not once a poll
        assert sorted(attention(w.store, "a", w.clock)) == sorted(d.error for d in held)
        assert [r.state for r in request_rows(w)] == ["dispatched"] * 4 and invariants.batches_created(w) == 2

        monkeypatch.setenv(WRONG_KEY_ENV, KEY)  # the operator fixes the key
        w.run(w.engine.aclose())
        w.engine = w._new_engine()
        rounds(w, 4, 600)
        assert [r.state for r in request_rows(w)] == ["succeeded"] * 4
        assert invariants.batches_created(w) == 2  # nothing sent twice
        assert invariants.bill_matches(w, drained=True) == []  # every answer paid for is booked
        assert job_state(w) == "finished" and attention(w.store, "a", w.clock) == []


def test_a_cancel_gives_up_a_batch_held_on_its_poll_its_requests_cancelled(tmp_path, monkeypatch):
    with world(tmp_path) as w:
        _sent_then_key_refused(w, monkeypatch)
        rounds(w, 2, 600)
        cancel_job(w.store, "a", w.clock)
        rounds(w, 4, 600)
        assert [d.state for d in dispatch_rows(w)] == ["failed", "failed"]
        rows = request_rows(w)
        assert [r.state for r in rows] == ["cancelled"] * 4
        assert all("refused the key on every poll of batch" in r.error_message and "given up as the job was cancelled" in r.error_message
                   for r in rows)  # fmt: skip
        assert job_state(w) == "cancelled" and attention(w.store, "a", w.clock) == []


def test_a_batch_held_on_its_poll_at_the_deadline_cut_over_is_read_late_its_requests_on_the_fallback(tmp_path, monkeypatch):
    # The cut-over (9 h in: the deadline less the fallback's hour) asks every batch in flight to
    # cancel; that flag is not the job cancelled. Given up as if it were, the batch was never
    # read, its bill never booked, its requests told "the job was cancelled".
    with world(tmp_path) as w:
        fallback = w.fallback("echo", HOURS, "azure-batch")
        _sent_then_key_refused(w, monkeypatch, deadline=START + 10 * HOURS, fallback=fallback)
        rounds(w, 20, 1800)  # to the deadline: every poll refused, the cut-over and its grace past
        held = _batches(w)
        assert [(d.state, d.cut_at is not None) for d in held] == [("submitted", True)] * 2, [d.error for d in held]
        assert all(d.error.startswith("held: the provider refused the key while polling batch") for d in held)
        rows = request_rows(w)
        assert [r.state for r in rows] == ["succeeded"] * 4  # the fallback answered them, after the grace
        assert job_state(w) == "finished"
        assert not any("cancelled" in (r.error_message or "") for r in rows)

        monkeypatch.setenv(WRONG_KEY_ENV, KEY)  # the operator fixes the key: the late batch is read
        w.run(w.engine.aclose())
        w.engine = w._new_engine()
        rounds(w, 4, 600)
        assert [d.state for d in _batches(w)] == ["ended", "ended"]
        assert [r.state for r in request_rows(w)] == ["succeeded"] * 4  # the fallback's answers stay
        assert invariants.batches_created(w) == 2
        assert invariants.bill_matches(w, drained=True) == []  # what the late batch bills is booked
        assert attention(w.store, "a", w.clock) == []


def _batches(w) -> list:
    """The job's azure-batch dispatches (not the fallback's)."""
    return [d for d in dispatch_rows(w) if d.route == "azure-batch"]
