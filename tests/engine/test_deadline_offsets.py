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
