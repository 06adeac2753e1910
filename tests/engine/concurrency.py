"""Two real transactions in a chosen order: one held open just before its COMMIT while
another runs, on a second Store (its own connections) in a thread."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from lowtide.store.db import Store
from tests.conftest import wait_until


@contextmanager
def held_before_commit(store: Store) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The next transaction `store` commits stops just before its COMMIT: `entered` is set
    then, and it commits when the test sets `go` (or when the block ends)."""
    entered, go = threading.Event(), threading.Event()

    def hold(_conn) -> None:
        if not entered.is_set():
            entered.set()
            go.wait(60)

    event.listen(store.engine, "commit", hold)
    try:
        yield entered, go
    finally:
        go.set()
        event.remove(store.engine, "commit", hold)


class Background(threading.Thread):
    """Runs `fn` in a thread; `result()` gives its value or raises its error."""

    def __init__(self, fn: Callable[[], Any]):
        super().__init__(daemon=True)
        self.fn = fn
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as err:  # handed to the test thread
            self.error = err

    def result(self, timeout: float = 60) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "the background transaction never ended"
        if self.error is not None:
            raise self.error
        return self.value


def second_store(store: Store) -> tuple[Store, str | None]:
    """Another Store on the same database, and (PostgreSQL) the application_name its
    sessions carry, so that `waits_for_a_lock` can find them in pg_stat_activity."""
    if store.is_sqlite:
        return Store(store.location), None
    name = f"lt_{uuid.uuid4().hex[:12]}"
    return Store(f"{store.location}&application_name={name}"), name


def ran_or_waits(store: Store, app_name: str | None, thread: Background) -> None:
    """Wait until `thread` has either ended or is blocked behind the held transaction: on
    PostgreSQL, its session waits for a lock (pg_stat_activity); on SQLite, it is inside its
    BEGIN IMMEDIATE (store/db.py `_on_begin`), which cannot return while another writer holds
    the store."""
    if app_name is None:
        wait_until(lambda: not thread.is_alive() or _inside(thread, "_on_begin"), what="the second transaction to begin")
        return
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = :name AND wait_event_type = 'Lock'"
    )

    def settled() -> bool:
        if not thread.is_alive():
            return True
        with store.engine.connect() as conn:
            return conn.execute(query, {"name": app_name}).scalar_one() > 0

    wait_until(settled, what="the second transaction to end or to wait for the lock")


def _inside(thread: threading.Thread, function: str) -> bool:
    """Is `thread` running `function` right now (anywhere on its stack)?"""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False
