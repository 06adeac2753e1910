"""The server's backend route, owned by one thread: the worker's batches and the real-time
endpoints share one instance of it, and only that thread's event loop ever calls it.

Why one shared instance on its own loop. A direct route may hold loop-bound state and
costly resources: the `local` route loads its model once and keeps an `asyncio.Lock` and
a llama.cpp engine thread that answer on the loop that asked. The worker runs the batch
engine on its thread and loop, and HTTP handlers run on uvicorn's; calling one route
instance from both loops is not safe, and giving real time its own instance would load
the model twice. So `Backend` starts a thread with one event loop (the *owner loop*) and
every call on the route happens there:

- real time: `await backend.run(request)` from any loop. A small collector on the owner
  loop gathers the requests that arrive within `WINDOW` seconds of the first one (or
  until the route's `dispatch_size` is reached) and runs them as one
  `route.execute(group)` call; each caller gets its own `Outcome`, matched by
  `custom_id`, through a future. Several groups may be in flight at once.
- batches: the worker's engine is handed `backend.route` (in `ServeConfig.routes`), a
  `SharedRoute` that forwards each `execute` to the owner loop and relays the outcomes
  back to the worker's loop as they come.

The owner loop does nothing but drive the route, so loading a big batch on the worker's
thread never delays a real-time answer. A route given in `ServeConfig.routes` is the
embedder's and is not closed here; one built from the backend's name is closed on stop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Literal, TypeVar

from lowtide.core.errors import RouteError
from lowtide.core.types import Outcome, Request
from lowtide.routes.base import DirectRoute

WINDOW = 0.002  # seconds: real-time requests arriving this close together run as one group
T = TypeVar("T")


class BackendClosed(RouteError):
    """The server is stopping; the request was not run."""


class Backend:
    """A direct route on its own thread and event loop. `start()`, then `run()` from any
    thread's loop; `stop()` cancels what is running and closes the route if it is ours."""

    def __init__(self, route: DirectRoute, *, owned: bool = True, window: float | None = None):
        self.inner = route
        self.owned = owned
        self.window = WINDOW if window is None else window
        self.route = SharedRoute(self)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._pending: list[tuple[Request, concurrent.futures.Future[Outcome]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self._ids = itertools.count(1)

    # Running ---------------------------------------------------------------------------
    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), name="lowtide-serve-backend", daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self, grace: float = 10.0) -> None:
        loop, thread = self.loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._stop.set)
        thread.join(grace)

    def _main(self, ready: threading.Event) -> None:
        asyncio.run(self._serve(ready))

    async def _serve(self, ready: threading.Event) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        ready.set()
        try:
            await self._stop.wait()
        finally:
            if self._timer is not None:
                self._timer.cancel()
            closed = BackendClosed("the server is stopping; the request was not run")
            for _, future in self._pending:
                _settle(future, error=closed)
            self._pending = []
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.owned:
                await self.inner.aclose()
            self.loop = None

    def _on_owner(self) -> bool:
        return self._thread is threading.current_thread()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Call `fn(*args)` on the owner loop and wait for it (from another thread), or
        directly when the owner is not running or this is its thread."""
        loop = self.loop
        if loop is None or self._on_owner():
            return fn(*args)
        result: concurrent.futures.Future[T] = concurrent.futures.Future()

        def invoke() -> None:
            try:
                result.set_result(fn(*args))
            except BaseException as err:  # handed to the caller
                result.set_exception(err)

        loop.call_soon_threadsafe(invoke)
        return result.result()

    # Real time: the collector ----------------------------------------------------------
    def new_id(self) -> str:
        return f"rt-{next(self._ids)}"

    async def run(self, request: Request) -> Outcome:
        """Run one request as part of the next group; its outcome (or the route's error)."""
        loop = self.loop
        if loop is None:
            raise BackendClosed("the server's backend is not running")
        future: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
        try:
            loop.call_soon_threadsafe(self._add, request, future)
        except RuntimeError:  # the owner loop closed meanwhile
            raise BackendClosed("the server is stopping; the request was not run") from None
        return await asyncio.wrap_future(future)

    def _add(self, request: Request, future: concurrent.futures.Future[Outcome]) -> None:
        """On the owner loop: check the model, then queue the request for the next group."""
        if self._stop is not None and self._stop.is_set():
            _settle(future, error=BackendClosed("the server is stopping; the request was not run"))
            return
        try:
            self.inner.check_model(request.model)
        except RouteError as err:
            _settle(future, Outcome.failure(request.custom_id, "model_not_found", str(err), False))
            return
        self._pending.append((request, future))
        if len(self._pending) >= max(1, self.inner.dispatch_size):
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.window, self._flush)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        group = [(r, f) for r, f in self._pending if not f.done()]  # a caller that gave up is left out
        self._pending = []
        if group:
            self._track(asyncio.get_running_loop().create_task(self._execute(group)))

    def _track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, group: list[tuple[Request, concurrent.futures.Future[Outcome]]]) -> None:
        waiting = {r.custom_id: f for r, f in group}
        try:
            async with contextlib.aclosing(self.inner.execute([r for r, _ in group])) as outcomes:
                async for outcome in outcomes:
                    future = waiting.pop(outcome.custom_id, None)
                    if future is not None:
                        _settle(future, outcome)
        except asyncio.CancelledError:
            for future in waiting.values():
                _settle(future, error=BackendClosed("the server is stopping; the request was not run"))
            raise
        except Exception as err:  # the route broke: every caller it did not answer gets the error
            for future in waiting.values():
                _settle(future, error=err)
            return
        name = self.inner.name
        for custom_id, future in waiting.items():
            _settle(future, Outcome.failure(custom_id, "no_result", f"route {name} returned no result", True))

    # Batches: relaying the worker's executions -----------------------------------------
    async def _drain(self, requests: Sequence[Request], relay: _Relay) -> None:
        """On the owner loop: run the worker's dispatch, handing each outcome to `relay`."""
        task = asyncio.current_task()
        if task is not None:
            self._track(task)
        try:
            async with contextlib.aclosing(self.inner.execute(requests)) as outcomes:
                async for outcome in outcomes:
                    relay.put(outcome)
        except asyncio.CancelledError:  # the worker stopped listening, or the server is stopping
            relay.end(BackendClosed("the server is stopping; the dispatch was cut short"))
            raise
        except Exception as err:
            relay.end(err)
        else:
            relay.end()


def _settle(future: concurrent.futures.Future, outcome: Outcome | None = None, error: BaseException | None = None) -> None:
    """Resolve a caller's future unless the caller gave up on it."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(outcome)


class _Relay:
    """Outcomes from the owner loop to a consumer on another loop. The owner hands them over
    in bursts (whenever its loop turns, or every `BURST` outcomes), waking the consumer once
    per burst rather than once per outcome."""

    BURST = 1000

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[Outcome] = []
        self._buffer: list[Outcome] = []  # owner side, not yet handed over
        self._scheduled = False
        self._ended = False
        self._error: BaseException | None = None
        self._event = asyncio.Event()

    def put(self, outcome: Outcome) -> None:  # owner loop
        self._buffer.append(outcome)
        if len(self._buffer) >= self.BURST:
            self._hand_over()
        elif not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._hand_over)

    def end(self, error: BaseException | None = None) -> None:  # owner loop
        self._hand_over(ended=True, error=error)

    def _hand_over(self, ended: bool = False, error: BaseException | None = None) -> None:
        self._scheduled = False
        buffer, self._buffer = self._buffer, []
        if not buffer and not ended:
            return
        with self._lock:
            wake = not self._items
            self._items.extend(buffer)
            if ended:
                self._ended, self._error = True, error
        if wake or ended:
            with contextlib.suppress(RuntimeError):  # the consumer's loop closed: nobody waits
                self._loop.call_soon_threadsafe(self._event.set)

    async def take(self) -> tuple[list[Outcome], bool, BaseException | None]:  # consumer loop
        while True:
            self._event.clear()
            with self._lock:
                items, self._items = self._items, []
                ended, error = self._ended, self._error
            if items or ended:
                return items, ended, error
            await self._event.wait()


class SharedRoute:
    """The backend route as the worker's engine sees it: the same contract, every call
    forwarded to the owner loop. Other attributes are read from the route itself."""

    kind: Literal["direct"] = "direct"

    def __init__(self, backend: Backend):
        self._backend = backend
        self.name = backend.inner.name

    @property
    def dispatch_size(self) -> int:
        return self._backend.inner.dispatch_size

    def check_model(self, model: str) -> None:
        self._backend.call(self._backend.inner.check_model, model)

    async def execute(self, requests: Sequence[Request]) -> AsyncIterator[Outcome]:
        backend = self._backend
        loop = backend.loop
        if loop is None or backend._on_owner():  # not started (or already on the owner loop)
            async with contextlib.aclosing(backend.inner.execute(requests)) as outcomes:
                async for outcome in outcomes:
                    yield outcome
            return
        relay = _Relay(asyncio.get_running_loop())
        running = asyncio.run_coroutine_threadsafe(backend._drain(list(requests), relay), loop)
        try:
            while True:
                items, ended, error = await relay.take()
                for outcome in items:
                    yield outcome
                if ended:
                    if error is not None:
                        raise error
                    return
        finally:
            running.cancel()  # the consumer stopped early: stop the route's work too

    async def aclose(self) -> None:
        """Nothing: the backend closes the route when the server stops."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._backend.inner, name)
