"""What a piece of code costs the store, counted without a clock: SQLite's own virtual-
machine steps, deterministic for a given store and statement."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from lowtide.store.db import Store


@contextmanager
def sqlite_steps(store: Store) -> Iterator[list[int]]:
    """SQLite virtual-machine steps (in tens) run by the store's statements meanwhile."""
    steps = [0]
    counting = [True]  # a pooled connection keeps its handler after this: it counts no more

    def count() -> int:
        steps[0] += counting[0]
        return 0  # go on

    def watch(conn, *_):
        conn.connection.driver_connection.set_progress_handler(count, 10)

    sa.event.listen(store.engine, "before_cursor_execute", watch)
    try:
        yield steps
    finally:
        counting[0] = False
        sa.event.remove(store.engine, "before_cursor_execute", watch)
