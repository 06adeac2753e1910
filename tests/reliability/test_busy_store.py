"""A writer that waits past SQLite's busy timeout for another process's write lock (a load of
a large source is one transaction of minutes): the command says what happened and what to do,
in lowtide's words, not "unexpected error: OperationalError", and nothing of it is applied."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
import sqlalchemy as sa

from lowtide.cli.common import known_failure
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.queries import request_counts
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv


def test_a_tick_that_waits_past_the_busy_timeout_is_told_in_lowtides_words(tmp_path, clock):
    spec = make_spec(write_csv(tmp_path / "tickets.csv", ticket_rows(5)))
    path = tmp_path / "lowtide.db"
    loaded = Store(str(path))
    job_id = load_job(loaded, spec, clock).job_id
    loaded.close()
    store = Store(str(path), busy_timeout=0.2)  # the store's own wait, shortened (60 s by default)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's load, delete or vacuum

        async def tick() -> None:
            async with Engine(store, clock) as engine:
                await engine.tick(spec.name)

        with pytest.raises(sa.exc.OperationalError) as caught:
            asyncio.run(tick())
        said = known_failure(caught.value)
        assert said is not None and said.startswith("the store is busy: another process held its write lock"), said
        assert "Run the command again once that is done" in said and "PostgreSQL" in said
        other.execute("ROLLBACK")
        with store.read() as conn:
            assert request_counts(conn, job_id) == {"pending": 5}  # nothing of the tick applied
    finally:
        other.close()
        store.close()


def test_an_idle_worker_ticks_on_while_another_process_holds_the_write_lock(tmp_path, clock):
    # A worker with nothing to do reads only: its ticks neither wait for a long writer (the
    # next night's load, a delete) nor fail when it holds the lock past the busy timeout.
    spec = make_spec(write_csv(tmp_path / "tickets.csv", ticket_rows(3)))
    path = tmp_path / "lowtide.db"
    done = Store(str(path))
    drive_to_end(done, spec, clock)
    done.close()
    store = Store(str(path), busy_timeout=0.2)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")

        async def idle() -> tuple[bool, float | None]:
            async with Engine(store, clock) as engine:
                ticks = [await engine.tick() for _ in range(3)]
                return any(t.busy for t in ticks), engine.next_due()

        assert asyncio.run(idle()) == (False, None)
        other.execute("COMMIT")  # and the writer was never held up by it
    finally:
        other.close()
        store.close()
