"""Group commit: the deferred requests of concurrent callers go into one transaction.

Each handler puts its row on the queue and awaits its future; one writer task takes
everything queued (up to `max_rows`), inserts it in one transaction on a worker thread
(the event loop keeps accepting meanwhile), and only after the COMMIT resolves the
futures, so every `202 Accepted` is sent after its own row is durable. While one commit
runs the next group gathers, so the cost of a commit is shared by the requests that
arrived during the previous one. A failed commit fails every request of its group (503).

Durability is the store's: on SQLite (WAL, `synchronous=NORMAL`) a committed row survives
the process dying at any point; a power cut may lose the last commits, as for every other
lowtide write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from lowtide.server.gateway import records
from lowtide.store.db import Store

log = logging.getLogger("lowtide.gateway")


class GroupWriter:
    def __init__(self, store: Store, max_rows: int = 2000, on_commit: Callable[[int], None] | None = None):
        self.store = store
        self.max_rows = max_rows
        self.on_commit = on_commit
        self._queue: asyncio.Queue[tuple[dict[str, Any], asyncio.Future]] | None = None
        self._task: asyncio.Task | None = None
        self.commits = 0
        self.rows = 0

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._run(), name="lowtide-gateway-writer")

    async def stop(self) -> None:
        """Commit what is queued, then stop."""
        if self._task is None or self._queue is None:
            return
        await self._queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def write(self, row: dict[str, Any]) -> None:
        """Return once `row` is committed (raises what the commit raised)."""
        assert self._queue is not None, "the writer is not started"
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((row, future))
        await future

    async def _run(self) -> None:
        queue = self._queue
        assert queue is not None
        while True:
            group = [await queue.get()]
            while len(group) < self.max_rows and not queue.empty():
                group.append(queue.get_nowait())
            try:
                await asyncio.to_thread(self._commit, [row for row, _ in group])
            except Exception as err:  # every caller of this group hears of it
                log.error("gateway: could not store %d deferred request(s): %s", len(group), type(err).__name__)
                for _, future in group:
                    if not future.done():
                        future.set_exception(err)
            else:
                self.commits += 1
                self.rows += len(group)
                for _, future in group:
                    if not future.done():
                        future.set_result(None)
                if self.on_commit is not None:
                    self.on_commit(len(group))
            finally:
                for _ in group:
                    queue.task_done()

    def _commit(self, rows: list[dict[str, Any]]) -> None:
        with self.store.begin() as conn:
            records.insert_accepted(conn, rows)
