"""Deadlines carry their UTC offset both ways (issue 15 item 7): a spec without one is
refused (tests/core/test_spec.py), and a failure message prints the time with its offset."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import sqlalchemy as sa

from lowtide.engine.control import job_status
from lowtide.store.schema import requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv


def test_a_passed_deadline_is_printed_with_its_utc_offset(store, clock, tmp_path):
    # Given in +02:00; the message says the same instant in UTC, offset and all, whatever
    # the machine's local time zone.
    when = datetime.fromtimestamp(clock.now() - 3600, timezone(timedelta(hours=2))).replace(microsecond=0)
    source = write_csv(tmp_path / "t.csv", ticket_rows(2))
    status = drive_to_end(store, make_spec(source, deadline=when.isoformat()), clock)
    assert status.counts == {"failed": 2}
    with store.begin() as conn:
        messages = set(conn.execute(sa.select(requests.c.error_message)).scalars())
    utc = when.astimezone(UTC).isoformat(timespec="seconds")
    assert utc.endswith("+00:00")
    assert messages == {f"the job's deadline ({utc}) passed before this request was sent; raise `deadline` and run `lowtide retry JOB --failed`"}
    assert job_status(store, "tickets").counts == {"failed": 2}


def test_a_request_sent_before_the_deadline_keeps_its_last_attempts_words(store, clock, tmp_path):
    # Sent once, failed retryably, waiting to go again when the deadline passes: its message
    # says so and keeps the last failure, on SQLite and PostgreSQL alike (an SQL concatenation).
    from lowtide.engine.context import JobContext
    from lowtide.engine.fate import past_deadline
    from lowtide.engine.loader import load_job
    from lowtide.store.schema import jobs

    source = write_csv(tmp_path / "t.csv", ticket_rows(2))
    load_job(store, make_spec(source, deadline=datetime.fromtimestamp(clock.now() + 60, UTC).isoformat()), clock)
    with store.begin() as conn:
        first = conn.execute(sa.select(sa.func.min(requests.c.id))).scalar_one()
        conn.execute(requests.update().where(requests.c.id == first).values(attempts=1, error_code="batch_lost", error_message="x" * 3000))
        job = JobContext.from_row(conn.execute(sa.select(jobs)).one())
        assert past_deadline(conn, job, clock.now() + 61) == 2
        said = dict(conn.execute(sa.select(requests.c.id, requests.c.error_message)).all())
    assert said[first].startswith("the job's deadline (") and "could be sent again" in said[first]
    assert "its last attempt: batch_lost: xxx" in said[first] and len(said[first]) == 2000
    assert [m for i, m in said.items() if i != first][0].endswith("before this request was sent; raise `deadline` and run `lowtide retry JOB --failed`")
