"""`engine/overview.py`, the dashboard's figures, against the store on SQLite and PostgreSQL:
progress by state, the two failure counts (requests and attempts) and how they differ, a
job's failed rows paged and filtered, ETA from the job's own times, and the phases the
poller records for the batch timeline."""

from __future__ import annotations

import sqlalchemy as sa

from lowtide.core.types import Outcome
from lowtide.engine import overview
from lowtide.engine.report import cost_report
from lowtide.store.payloads import payload_chars
from lowtide.store.queries import note_phase, request_counts
from lowtide.store.schema import attempts, dispatch_phases, dispatches, requests
from tests.engine.ledger_helpers import NOW, dispatch, ingest, ok, stored_job


def mixed_job(store, tmp_path):
    """r0..r9: r0-r3 succeed, r4 and r5 fail for good, r6 fails and waits for its retry, r7
    is still in the batch, r8 and r9 were never sent. Results arrive 100 s after the send."""
    job = stored_job(store, tmp_path, n=10)
    batch = dispatch(store, job, "echo-batch", [f"r{i}" for i in range(8)])
    outcomes = [ok(f"r{i}", input_tokens=10) for i in range(4)] + [
        Outcome.failure("r4", "invalid_request", "r4: messages[0].content is empty", False),
        Outcome.failure("r5", "invalid_request", "r5: model gpt-x does not exist (100% sure)", False),
        Outcome.failure("r6", "server_error", "upstream 503", True),
    ]
    ingest(store, job, batch, "echo-batch", outcomes, now=NOW + 100)
    return job, batch


def test_progress_and_the_two_failure_counts(store, tmp_path):
    job, _ = mixed_job(store, tmp_path)
    with store.begin() as conn:
        progress = overview.Progress.of(request_counts(conn, job.id))
        failures = overview.failures(conn, job.id)
    assert progress == overview.Progress(succeeded=4, failed=2, cancelled=0, waiting=3, in_flight=1)
    assert (progress.total, progress.done, progress.pending) == (10, 6, 4)
    assert progress.as_dict() == {"succeeded": 4, "failed": 2, "cancelled": 0, "waiting": 3, "in_flight": 1,
                                       "pending": 4, "done": 6, "total": 10}  # fmt: skip
    # Failed requests: the terminal ones, by reason, adding up. Failed attempts: the tries,
    # r6's retried one too, as `lowtide report` counts them.
    assert failures.requests == progress.failed == sum(failures.by_reason.values()) == 2
    assert failures.by_reason == {"invalid_request": 2}
    report = cost_report(store, job=job.name).total
    assert failures.attempts == report.failures == 3 and failures.billed_attempts == report.billed_failures


def test_failed_rows_are_paged_in_source_order_and_filtered(store, tmp_path):
    job, _ = mixed_job(store, tmp_path)
    with store.begin() as conn:
        every = overview.failed_rows(conn, job.id)
        first = overview.failed_rows(conn, job.id, limit=1)
        second = overview.failed_rows(conn, job.id, offset=1, limit=1)
        by_reason = overview.failed_rows(conn, job.id, reason="invalid_request")
        other_reason = overview.failed_rows(conn, job.id, reason="server_error")  # r6 was retried, not failed
        by_id = overview.failed_rows(conn, job.id, search="R5")
        by_message = overview.failed_rows(conn, job.id, search="is empty")
        literal = overview.failed_rows(conn, job.id, search="100%")  # % and _ are text, not wildcards
        wildcard = overview.failed_rows(conn, job.id, search="_")
        clamped = overview.failed_rows(conn, job.id, limit=10_000)
    assert every.total == 2 and [r["custom_id"] for r in every.rows] == ["r4", "r5"]
    assert every.rows[0] | {"at": None} == {
        "custom_id": "r4", "source_row": 5, "reason": "invalid_request", "message": "r4: messages[0].content is empty",
        "attempts": 1, "route": "echo-batch", "at": None,
    }  # fmt: skip
    assert every.rows[0]["at"] == NOW + 100
    assert [r["custom_id"] for r in first.rows + second.rows] == ["r4", "r5"] and first.total == second.total == 2
    assert by_reason.total == 2 and other_reason.total == 0 and other_reason.rows == []
    assert [r["custom_id"] for r in by_id.rows] == ["r5"] and [r["custom_id"] for r in by_message.rows] == ["r4"]
    assert [r["custom_id"] for r in literal.rows] == ["r5"] and wildcard.total == 0
    assert clamped.limit == overview.MAX_PAGE


def test_eta_comes_from_the_jobs_own_rate(store, tmp_path):
    job, _ = mixed_job(store, tmp_path)
    with store.begin() as conn:
        progress = overview.Progress.of(request_counts(conn, job.id))
        eta = overview.eta(conn, job.id, progress)
    # 6 requests done in the 100 s since the batch was made: 0.06/s; 4 left: 66.7 s more.
    assert eta is not None
    assert abs(eta.rate_per_s - 0.06) < 1e-9 and abs(eta.remaining_s - 4 / 0.06) < 1e-6
    assert eta.last_progress_at == NOW + 100 and abs(eta.at - (NOW + 100 + 4 / 0.06)) < 1e-6


def test_no_eta_before_anything_finished_or_once_nothing_is_left(store, tmp_path):
    fresh = stored_job(store, tmp_path, name="fresh", n=2)
    dispatch(store, fresh, "echo-batch", ["r0", "r1"])
    done = stored_job(store, tmp_path, name="done", n=1)
    ingest(store, done, dispatch(store, done, "echo-batch", ["r0"]), "echo-batch", [ok("r0")], now=NOW + 5)
    with store.begin() as conn:
        assert overview.eta(conn, fresh.id, overview.Progress.of(request_counts(conn, fresh.id))) is None
        assert overview.eta(conn, done.id, overview.Progress.of(request_counts(conn, done.id))) is None


def test_the_job_estimate_is_the_budgets_bound_over_every_request(store, tmp_path):
    job = stored_job(store, tmp_path, n=4, model="gpt-4o-mini", route="openai-batch")
    with store.begin() as conn:
        est = overview.job_estimate(conn, job.id)
        chars = conn.execute(sa.select(sa.func.sum(payload_chars())).where(requests.c.job_id == job.id)).scalar()
        again = overview.job_estimate(conn, job.id)
    assert (est.requests, est.output_tokens) == (4, 4 * 256)  # max_tokens of each
    assert est.input_tokens == -(-chars // 4) and est.usd is not None and est.usd > 0
    assert again is est  # cached while the requests are unchanged
    d = overview.estimate_dict(est)
    assert d["usd"] == str(est.usd) and d["note"] is None


def test_the_poller_records_a_phase_when_it_changes(store, tmp_path):
    job = stored_job(store, tmp_path, n=1)
    batch = dispatch(store, job, "echo-batch", ["r0"])
    seen = ["validating", "validating", "in_progress", "in_progress", "finalizing", "completed"]
    with store.begin() as conn:
        for i, phase in enumerate(seen):
            note_phase(conn, batch, phase, NOW + i)  # as `batches.poll` does, before it writes the phase
            conn.execute(sa.update(dispatches).where(dispatches.c.id == batch).values(phase=phase))
        note_phase(conn, batch, None, NOW + 99)  # a route that reports no phase
        rows = conn.execute(sa.select(dispatch_phases.c.phase, dispatch_phases.c.at).order_by(dispatch_phases.c.id)).all()
        count, timeline = overview.batch_timeline(conn, job.id)
        tries = conn.execute(sa.select(sa.func.count()).select_from(attempts)).scalar()
    assert [tuple(r) for r in rows] == [("validating", NOW), ("in_progress", NOW + 2), ("finalizing", NOW + 4), ("completed", NOW + 5)]
    assert count == 1 and timeline[0]["phases"] == [{"phase": p, "at": t} for p, t in rows]
    assert timeline[0]["counts"] == {"succeeded": 0, "failed": 0, "in_batch": 1} and tries == 0
