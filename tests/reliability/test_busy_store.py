"""A writer that waits past SQLite's busy timeout for another process's write lock (a load of
a large source is one transaction of minutes): the command says what happened and what to do,
in lowtide's words, not "unexpected error: OperationalError", and nothing of it is applied. A
worker waits it out instead: answers in hand are written once the lock is free (they are paid
for), and a tick the store was too busy for goes again."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
import sqlalchemy as sa

from lowtide.cli.common import known_failure
from lowtide.engine.loader import load_job
from lowtide.engine.runner import work
from lowtide.engine.tick import Engine
from lowtide.routes.own.echo import EchoRoute
from lowtide.store.db import Store
from lowtide.store.queries import request_counts
from lowtide.store.schema import attempts
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


def _released_when_refused(store: Store, other: sqlite3.Connection) -> list[str]:
    """The other process's transaction ends the moment one of `store`'s writes has waited
    its busy timeout for it and failed (so each test knows the failure happened, with no
    timing): the returned list gets one entry per release."""
    released: list[str] = []

    @sa.event.listens_for(store.engine, "handle_error")
    def _release(context) -> None:
        if "database is locked" in str(context.original_exception) and other.in_transaction:
            other.execute("COMMIT")
            released.append(str(context.original_exception))

    return released


def _loaded_beside_another_process(tmp_path, clock, rows: int):
    """A job of `rows` pending requests in a store opened with a 0.2 s busy timeout, another
    process's connection to the same file (not in a transaction yet), and `released`."""
    spec = make_spec(write_csv(tmp_path / "tickets.csv", ticket_rows(rows)))
    path = tmp_path / "lowtide.db"
    loaded = Store(str(path))
    job_id = load_job(loaded, spec, clock).job_id
    loaded.close()
    store = Store(str(path), busy_timeout=0.2)
    other = sqlite3.connect(path, isolation_level=None)
    return spec, job_id, store, other, _released_when_refused(store, other)


class AnswersThenALoadBegins(EchoRoute):
    """echo, and as its last answer comes back another process begins a long write (the next
    night's load), before the worker has written any of them."""

    def __init__(self, other: sqlite3.Connection):
        super().__init__({})
        self.other = other

    async def execute(self, requests):
        async for outcome in super().execute(requests):
            yield outcome
        self.other.execute("BEGIN IMMEDIATE")


def test_answers_in_hand_wait_for_a_busy_store_and_are_written_once(tmp_path, clock, caplog):
    spec, job_id, store, other, released = _loaded_beside_another_process(tmp_path, clock, 5)
    try:

        async def tick() -> None:
            async with Engine(store, clock, routes={"echo": AnswersThenALoadBegins(other)}) as engine:
                await engine.tick(spec.name)

        asyncio.run(tick())  # before: the write failed, the answers were dropped and the tick raised
        assert len(released) == 1  # the write of the answers did wait past the timeout once
        assert "5 answers wait to be written" in caplog.text
        with store.read() as conn:
            assert request_counts(conn, job_id) == {"succeeded": 5}
            tried = conn.execute(sa.select(attempts.c.request_id, attempts.c.applied)).all()
        assert len(tried) == 5 and {r.request_id for r in tried} == set(range(1, 6)) and all(r.applied for r in tried)
    finally:
        other.close()
        store.close()


def test_a_worker_goes_on_after_a_tick_the_store_was_too_busy_for(tmp_path, clock, caplog):
    spec, job_id, store, other, released = _loaded_beside_another_process(tmp_path, clock, 4)
    try:
        other.execute("BEGIN IMMEDIATE")  # a load of millions of rows, begun before the worker's claim

        async def worker() -> None:
            async with Engine(store, clock) as engine:
                await work(engine, stop_when_idle=True)

        asyncio.run(worker())  # before: the loop ended with "database is locked"
        assert len(released) == 1
        assert "the tick's write was rolled back, ticking again" in caplog.text
        with store.read() as conn:
            assert request_counts(conn, job_id) == {"succeeded": 4}
    finally:
        other.close()
        store.close()
