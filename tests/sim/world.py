"""The simulation's world: the client's real store and engine, and `lowtide serve` (echo
backend) in this process as the provider, all on one ManualClock.

Two providers run: `main`, where every route points, and `other`, where a spec change may
point `base_url` (a provider that never heard of the batches in flight). Each serves on a
real loopback port (uvicorn in a thread, so the official SDKs talk HTTP unchanged), with
no worker thread: `step()` runs its worker's passes here, between the client's ticks, so
nothing races the test. Faults are swapped on the running servers (`set_faults`).

A kill is a real task cancellation at a drawn await point: the engine's batch routes are
wrapped so that the n-th route call of a tick cancels the tick, before the call or after
it returned (the provider did it; the client never hears). The next tick runs on a new
Engine over the same store, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from lowtide.core.clock import ManualClock
from lowtide.engine.tick import Engine
from lowtide.server.app import create_app
from lowtide.server.context import ServeConfig
from lowtide.server.faults import FaultPlan
from lowtide.store.db import Store
from tests.server.conftest import on_loopback

KEY_ENV = "LOWTIDE_SIM_KEY"  # the key every provider takes
WRONG_KEY_ENV = "LOWTIDE_SIM_WRONG_KEY"  # a key no provider takes (a spec change to api_key_env)
KEY = "sim-key"
NOTIFY_ENV = "LOWTIDE_SIM_NOTIFY_SECRET"  # every job notifies the world's receiver (invariants.notified_once)
START = 1_800_000_000.0
ROUTE_MODELS = {"openai-batch": "gpt-4o-mini", "anthropic-batch": "claude-3-5-haiku-latest",
                "gemini-batch": "gemini-2.5-flash", "echo-batch": "test-model",
                "openai-compatible-batch": "gpt-4o-mini", "azure-batch": "gpt-4o-mini",  # azure: the deployment's name
                "mistral-batch": "mistral-small-latest", "openrouter-batch": "openai/gpt-4o-mini"}  # fmt: skip
# Through lowtide serve: each speaks its API there (azure under /openai, mistral under /mistral,
# openrouter at /api/v1: server/azure_paths.py, mistral_api.py, openrouter_api.py).
SERVED = ("openai-batch", "anthropic-batch", "gemini-batch", "openai-compatible-batch", "azure-batch", "mistral-batch",
          "openrouter-batch")  # fmt: skip
PASSES = 30  # serve worker passes per step, at most (a pass that moves nothing ends the step)


class Provider:
    """One `lowtide serve --backend echo` on a loopback port, stepped by hand."""

    def __init__(self, name: str, root: Path, clock: ManualClock):
        self.name = name
        config = ServeConfig(backend="echo", data_dir=root / "data", db=str(root / "serve.db"), clock=clock,
                             run_worker=False, swappable_faults=True, api_keys=(KEY,))  # fmt: skip
        self.app = create_app(config)
        self._serving = contextlib.ExitStack()  # uvicorn in a thread, on a free loopback port
        self.port = self._serving.enter_context(on_loopback(self.app))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def server(self):
        return self.app.state.server

    @property
    def store(self) -> Store:
        return self.server.store

    def set_faults(self, plan: FaultPlan) -> None:
        self.server.faults.swap(plan)

    async def step(self, passes: int = PASSES) -> int:
        """Run the worker's passes until one moves nothing; how many moved something."""
        moved = 0
        for _ in range(passes):
            if not await self.app.state.worker.run_once():
                break
            moved += 1
        return moved

    def stop(self) -> None:
        self._serving.close()


class Killed(Exception):
    """The tick was cancelled at a drawn await point (a crash)."""


@dataclass
class KillPoint:
    call: int  # the n-th batch-route call of the tick (from 1)
    after: bool  # cancel once it returned (it happened), else before it is made


class _Fused:
    """A batch route whose `call`-th call cancels the running task (a crash there)."""

    def __init__(self, inner: Any, engine: SimEngine):
        self._inner, self._engine = inner, engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def _guard(self, after: bool) -> None:
        if self._engine.kill_due(after):
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)  # the cancellation lands here, as at any await

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self._engine.calls += 1
        await self._guard(after=False)
        result = await getattr(self._inner, name)(*args, **kwargs)
        await self._guard(after=True)
        return result

    async def submit(self, *args, **kwargs):
        return await self._call("submit", *args, **kwargs)

    async def find(self, *args, **kwargs):
        return await self._call("find", *args, **kwargs)

    async def poll(self, *args, **kwargs):
        return await self._call("poll", *args, **kwargs)

    async def cancel(self, *args, **kwargs):
        return await self._call("cancel", *args, **kwargs)

    async def results(self, *args, **kwargs) -> AsyncIterator[Any]:
        self._engine.calls += 1
        await self._guard(after=False)
        async for outcome in self._inner.results(*args, **kwargs):
            yield outcome
        await self._guard(after=True)


class SimEngine(Engine):
    """The real Engine; only its batch routes are wrapped in `_Fused` (the kill points)."""

    kill: KillPoint | None = None
    calls = 0

    def route_for(self, lane):
        route = super().route_for(lane)
        return _Fused(route, self) if route.kind == "batch" else route

    def kill_due(self, after: bool) -> bool:
        return self.kill is not None and self.calls == self.kill.call and self.kill.after == after


class Receiver:
    """Where the jobs' notifications go: a real HTTP server on loopback that answers 204."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/lowtide"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class World:
    """Client store + engine, two providers, one clock and one event loop."""

    def __init__(self, root: Path, store_url: str):
        os.environ[KEY_ENV] = KEY
        os.environ[WRONG_KEY_ENV] = "not-the-key"
        os.environ[NOTIFY_ENV] = "sim-notify-secret"
        self.receiver = Receiver()
        self.root = root
        self.clock = ManualClock(START)
        self.loop = asyncio.new_event_loop()
        self.providers = {n: Provider(n, root / f"serve-{n}", self.clock) for n in ("main", "other")}
        self.store = Store(store_url)
        self.generation = 0
        self.engine = self._new_engine()

    def _new_engine(self) -> SimEngine:
        self.generation += 1
        return SimEngine(self.store, self.clock, seed=self.generation)

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def tick(self):
        return self.run(self.engine.tick())

    def tick_killed(self, kill: KillPoint) -> bool:
        """A tick that dies at `kill` (if it gets that far); then a new engine. Whether it died."""
        self.engine.kill, self.engine.calls = kill, 0
        task = self.loop.create_task(self.engine.tick())
        try:
            self.loop.run_until_complete(task)
            died = False
        except asyncio.CancelledError:
            died = True
        old, self.engine = self.engine, self._new_engine()
        old.kill = None
        self.run(old.aclose())  # its connections close; its store rows stay as they were
        return died

    def serve_step(self) -> int:
        return sum(self.run(p.step()) for p in self.providers.values())

    def set_faults(self, plan: FaultPlan, provider: str = "main") -> None:
        self.providers[provider].set_faults(plan)

    def clear_faults(self) -> None:
        for p in self.providers.values():
            p.set_faults(FaultPlan())

    def route_options(self, route: str, chunk: int, provider: str = "main", key_env: str = KEY_ENV) -> dict[str, Any]:
        url = self.providers[provider].url
        polls = [60.0, 600.0]
        if route == "echo-batch":
            return {"dir": str(self.root / "echo-batch"), "max_requests": chunk, "polls_to_complete": 2}
        where = {"openai-batch": ("base_url", f"{url}/v1"), "openai-compatible-batch": ("base_url", f"{url}/v1"),
                 "azure-batch": ("endpoint", url), "mistral-batch": ("base_url", f"{url}/mistral"),
                 "openrouter-batch": ("base_url", f"{url}/api/v1")}.get(route, ("base_url", url))  # fmt: skip
        return {where[0]: where[1], "api_key_env": key_env, "poll_interval": polls, "max_requests": chunk}

    def close(self) -> None:
        try:
            self.run(self.engine.aclose())
            for p in self.providers.values():
                self.run(p.app.state.worker.aclose())
        finally:
            for p in self.providers.values():
                p.stop()
            self.receiver.stop()
            self.store.close()
            self.loop.close()
