"""An event loop on a thread of its own, beside the server's: serve's batch worker
(lifecycle.py) and the gateway's collector (gateway/collector.py) run their passes there, so a
slow pass never holds up an HTTP answer. Started and stopped from the server's side, woken
from any thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class LoopThread:
    """A subclass's `_serve` runs its passes until `_stopping`, waiting on `_wake` between them."""

    thread_name = "lowtide-loop"
    stop_grace = 5.0  # seconds a pass may go on after `stop` before it is cancelled

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False

    def start(self) -> None:
        """Start the thread; returns once its loop runs (`wake` then reaches it)."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), name=self.thread_name, daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self, grace: float | None = None) -> None:
        """Stop after the current pass; one still busy after `grace` seconds (a slow route) is
        cancelled: what it had not committed is redone by the next process on the store."""
        grace = self.stop_grace if grace is None else grace
        self._stopping = True
        self.wake()
        if self._thread is None:
            return
        self._thread.join(grace)
        if self._thread.is_alive() and self._loop is not None and self._task is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._task.cancel)
            self._thread.join()

    def wake(self) -> None:
        """Start the next pass now, not at the end of the idle wait."""
        self._set(self._wake)

    def _set(self, event: asyncio.Event | None) -> None:
        """Set one of the loop's events from any thread (nothing before the loop runs or after it closed)."""
        loop = self._loop
        if loop is None or event is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(event.set)

    def _main(self, ready: threading.Event) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            asyncio.run(self._run(ready))

    async def _run(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._wake = asyncio.Event()
        ready.set()
        await self._serve()

    async def _serve(self) -> None:
        raise NotImplementedError

    async def _idle(self, seconds: float) -> None:
        """Wait `seconds`, or less if woken."""
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        self._wake.clear()
