"""The simulation's world: the client's real store and engine, and `lowtide serve` (echo
backend) in this process as the provider, all on one ManualClock.

Two providers run: `main`, where every route points, and `other`, where a spec change may
point `base_url` (a provider that never heard of the batches in flight). Each serves on a
real loopback port (uvicorn in a thread, so the official SDKs talk HTTP unchanged), with
no worker thread: `step()` runs its worker's passes here, between the client's ticks, so
nothing races the test. Faults are swapped on the running servers (`set_faults`).

A kill is a real task cancellation at a drawn await point: the engine's routes are wrapped
so that the n-th route call of a tick cancels the tick, before the call or after it
returned (the provider did it; the client never hears). The next tick runs on a new
Engine over the same store, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from lowtide.core.clock import ManualClock
from lowtide.core.endpoints import MESSAGES
from lowtide.core.spec import default_endpoint
from lowtide.engine.tick import Engine
from lowtide.server.app import create_app
from lowtide.server.context import ServeConfig
from lowtide.server.faults import FaultPlan
from lowtide.server.kept import Kept
from lowtide.store.db import Store
from tests import objectstores
from tests.server.conftest import on_loopback

KEY_ENV = "LOWTIDE_SIM_KEY"  # the key every provider takes
WRONG_KEY_ENV = "LOWTIDE_SIM_WRONG_KEY"  # a key no provider takes (a spec change to api_key_env)
KEY = "sk-sim-7f3a9c1e5b20"
WRONG_KEY = "sk-wrong-2d8e4b6a91"
NOTIFY_ENV = "LOWTIDE_SIM_NOTIFY_SECRET"  # every job notifies the world's receiver (invariants.notified_once)
NOTIFY_SECRET = "whsec-sim-91c4e7a2d3"
SECRETS = (KEY, WRONG_KEY, NOTIFY_SECRET)  # never in a store, a file or a log line (invariants.no_secrets)
START = 1_800_000_000.0
ROUTE_MODELS = {"openai-batch": "gpt-4o-mini", "anthropic-batch": "claude-3-5-haiku-latest",
                "gemini-batch": "gemini-2.5-flash", "echo-batch": "test-model",
                "openai-compatible-batch": "gpt-4o-mini", "azure-batch": "gpt-4o-mini",  # azure: the deployment's name
                "mistral-batch": "mistral-small-latest", "openrouter-batch": "openai/gpt-4o-mini",
                "vertex-batch": "gemini-2.5-flash", "bedrock-batch": "us.anthropic.claude-3-5-haiku-20241022-v1:0",
                "digitalocean-batch": "openai-gpt-4o-mini", "echo": "test-model"}  # fmt: skip
# A job's real-time fallback (World.fallback), at the main provider: the route and its model,
# and the call a fault plan matches.
REALTIME_MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-3-5-haiku-latest"}
REALTIME_CALLS = ("POST /v1/chat/completions", "POST /v1/messages")
# Routes whose job `c` is `route: auto` (machine.AUTO_JOBS): the route, or real time at the same
# provider for the same model (both priced in the catalog).
AUTO_WITH = ("openai-batch", "anthropic-batch")
# Through lowtide serve: each speaks its API there (azure under /openai, mistral under /mistral,
# openrouter at /api/v1, vertex under /v1/projects, bedrock at /model-invocation-job, digitalocean under
# /digitalocean: server/azure_paths.py, mistral_api.py, openrouter_api.py, vertex_api.py, bedrock_api.py,
# digitalocean_api.py).
SERVED = ("openai-batch", "anthropic-batch", "gemini-batch", "openai-compatible-batch", "azure-batch", "mistral-batch",
          "openrouter-batch", "vertex-batch", "bedrock-batch", "digitalocean-batch")  # fmt: skip
# The routes whose inputs and outputs live in an object store, and the one each needs: both
# sides (serve and the route) reach it by the SDKs' own environment, as the route tests do.
OBJECT_STORE = {"vertex-batch": "gcs", "bedrock-batch": "s3"}
ROLE_ARN = "arn:aws:iam::123456789012:role/BedrockBatch"  # serve checks its shape only
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
    call: int  # the n-th route call of the tick (from 1)
    after: bool  # cancel once it returned (it happened), else before it is made


class _Fused:
    """A route whose `call`-th call cancels the running task (a crash there): a batch
    route's create, find, poll, cancel or read of results; a direct route's run of a
    dispatch (`execute`: before it answers, or once it answered all, its writes on their way)."""

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

    async def execute(self, *args, **kwargs) -> AsyncIterator[Any]:
        self._engine.calls += 1
        await self._guard(after=False)
        async for outcome in self._inner.execute(*args, **kwargs):
            yield outcome
        await self._guard(after=True)


class SimEngine(Engine):
    """The real Engine; its routes are wrapped in `_Fused` (the kill points)."""

    kill: KillPoint | None = None
    calls = 0

    def route_for(self, lane):
        route = super().route_for(lane)
        return _Fused(route, self)

    def kill_due(self, after: bool) -> bool:
        return self.kill is not None and self.calls == self.kill.call and self.kill.after == after


class Receiver:
    """A real HTTP server on loopback that records each POST (its headers, body and the status
    it answered) and answers `status()`: 204 where the jobs' notifications go; the gateway's
    webhook receiver answers 200, or 500 while failing (tests/sim/gateway.py)."""

    def __init__(self, path: str = "/lowtide", status: Callable[[], int] = lambda: 204):
        self.posts: list[tuple[dict[str, str], bytes, int]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                answered = status()
                receiver.posts.append(({k.lower(): v for k, v in self.headers.items()}, body, answered))
                self.send_response(answered)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class LogTap(logging.Handler):
    """Every log record while it is attached (from making to `detach`), as the lines a log
    file would hold (message and traceback): lowtide's at every level, other loggers' at
    their own."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self._ours = logging.getLogger("lowtide")
        self._level = self._ours.level
        self._ours.setLevel(logging.DEBUG)
        logging.getLogger().addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def detach(self) -> None:
        # Not `close`: logging's own configuration (uvicorn's, as serve starts) closes every
        # handler it finds, which must not take this one off.
        logging.getLogger().removeHandler(self)
        self._ours.setLevel(self._level)
        self.close()


class ObjectStores:
    """The GCS emulator and moto's S3 server (tests/objectstores.py), each started once per
    process on first use (a server per example would cost more than the example), and the
    environment that points Google's and AWS's SDKs (and gcsfs, s3fs) at them, set while a
    world lives and put back after it."""

    _servers: dict[str, Any] = {}
    _made = 0  # buckets made in this process: each world its own, so no key meets another's files

    @classmethod
    def _server(cls, kind: str):
        if kind not in cls._servers:
            import atexit

            port = objectstores._free_port()
            if kind == "gcs":
                from gcp_storage_emulator.server import create_server

                server = create_server("127.0.0.1", port, in_memory=True)
                server._api.daemon = True  # its stop() only joins the serving thread: the process would never exit
                cls._servers[kind] = objectstores.GcsServer(f"http://127.0.0.1:{port}")
            else:
                from moto.server import ThreadedMotoServer

                server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
                cls._servers[kind] = objectstores.S3Server(f"http://127.0.0.1:{port}")
            server.start()
            atexit.register(server.stop)
            import logging

            if kind == "gcs":  # a client gone before the answer was written (gcsfs closing early) is no error here
                server._api._httpd.handle_error = lambda request, address: None
                # its stop() logs at exit, to a stream pytest has closed by then ("--- Logging error ---")
                logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
            else:  # moto's server logs every request through werkzeug: thousands of lines a run
                logging.getLogger("werkzeug").setLevel(logging.WARNING)
        return cls._servers[kind]

    def __init__(self, kind: str):
        server = self._server(kind)
        if kind == "gcs":  # as tests/routes/test_vertex_batch.py's fixtures set it
            env = {"STORAGE_EMULATOR_HOST": server.endpoint, "NO_GCE_CHECK": "True", "FSSPEC_GCS_TOKEN": "anon",
                   "FSSPEC_GCS_PROJECT": "test"}  # fmt: skip
        else:  # as tests/routes/test_bedrock_batch.py's: the environment's chain only, S3 at moto
            env = {"AWS_ENDPOINT_URL": server.endpoint, "AWS_EC2_METADATA_DISABLED": "true", **objectstores.S3Server.env}
        self._before = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        self._conf = None
        if kind == "gcs":
            import fsspec.config

            self._conf = fsspec.config.conf.get("gcs")
            fsspec.config.conf["gcs"] = {"token": "anon", "project": "test"}
        objectstores._fresh_fsspec()
        ObjectStores._made += 1
        self.kind = kind
        self.url = server.bucket(f"lowtide-sim-{os.getpid()}-{ObjectStores._made}")

    def close(self) -> None:
        objectstores._fresh_fsspec()
        for k, v in self._before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self.kind == "gcs":
            import fsspec.config

            if self._conf is None:
                fsspec.config.conf.pop("gcs", None)
            else:
                fsspec.config.conf["gcs"] = self._conf


class World:
    """Client store + engine, two providers, one clock and one event loop."""

    def __init__(self, root: Path, store_url: str, route: str | None = None):
        # Before serve or a route is made: gcsfs and s3fs read their settings from it.
        self.objects = ObjectStores(OBJECT_STORE[route]) if route in OBJECT_STORE else None
        os.environ[KEY_ENV] = KEY
        os.environ[WRONG_KEY_ENV] = WRONG_KEY
        os.environ[NOTIFY_ENV] = NOTIFY_SECRET
        self.logs = LogTap()  # every log record while the world lives, any logger
        self.receiver = Receiver()
        self.root = root
        self.clock = ManualClock(START)
        self.loop = asyncio.new_event_loop()
        self.providers = {n: Provider(n, root / f"serve-{n}", self.clock) for n in ("main", "other")}
        self.store = Store(store_url)
        self.generation = 0
        # Creates `lowtide cancel --force` abandoned: (the dispatch's creation, the cancel, its
        # custom_ids). A provider batch without a key is told theirs by these (invariants.given_up).
        self.abandoned: list[tuple[float, float, frozenset[str]]] = []
        # Dispatch keys and provider batch ids of jobs `lowtide delete` took away, bills and all.
        self.deleted: set[str] = set()
        # The dashboard's kept figures, kept across the steps as a long-lived page keeps them
        # (invariants.figures_current).
        self.kept = Kept()
        self.figure_steps = 0
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
        if route == "echo":  # direct: answered in the worker, no provider (its PostgreSQL writes run beside the next claim)
            return {"dispatch_size": chunk}
        if route == "echo-batch":
            return {"dir": str(self.root / "echo-batch"), "max_requests": chunk, "polls_to_complete": 2}
        if route == "vertex-batch":  # the key is an access token (serve takes the world's key as one)
            assert self.objects is not None
            return {"base_url": url, "project": "proj", "location": "us-central1", "staging": f"{self.objects.url}/lowtide",
                    "access_token_env": key_env, "poll_interval": polls, "max_requests": chunk}  # fmt: skip
        if route == "bedrock-batch":  # no key: AWS's chain signs, and serve takes any signature
            assert self.objects is not None
            return {"endpoint_url": url, "role_arn": ROLE_ARN, "staging": f"{self.objects.url}/lowtide", "region": "us-east-1",
                    "poll_interval": polls, "max_requests": chunk}  # fmt: skip
        where = {"openai-batch": ("base_url", f"{url}/v1"), "openai-compatible-batch": ("base_url", f"{url}/v1"),
                 "azure-batch": ("endpoint", url), "mistral-batch": ("base_url", f"{url}/mistral"),
                 "openrouter-batch": ("base_url", f"{url}/api/v1"),
                 "digitalocean-batch": ("base_url", f"{url}/digitalocean")}.get(route, ("base_url", url))  # fmt: skip
        return {where[0]: where[1], "api_key_env": key_env, "poll_interval": polls, "max_requests": chunk}

    def fallback(self, kind: str, margin: float, route: str) -> dict[str, Any]:
        """A job's `fallback:` (docs/fallback.md): `echo`, answered in the worker, or the main
        provider's real time through the official SDK of the job's endpoint (Anthropic's for
        a Messages job, else OpenAI's), its retries a millisecond apart (no wall-clock waits)."""
        common = {"safety_margin": margin, "expected_turnaround": 3600}
        if kind == "echo":
            return {"route": "echo", "model": ROUTE_MODELS["echo"], **common}
        lane = self.realtime(route)
        return {**lane, "model": REALTIME_MODELS[lane["route"]], **common}

    def realtime(self, route: str) -> dict[str, Any]:
        """The main provider's real time for a job on `route`, in the API of its endpoint
        (Anthropic's for a Messages job, else OpenAI's), its retries a millisecond apart."""
        url, pause = self.providers["main"].url, [0.001, 0.002]
        if default_endpoint(route) == MESSAGES:
            return {"route": "anthropic", "route_options": {"base_url": url, "api_key_env": KEY_ENV, "retry_backoff": pause}}
        return {"route": "openai", "route_options": {"base_url": f"{url}/v1", "api_key_env": KEY_ENV, "retry_backoff": pause}}

    def close(self) -> None:
        try:
            self.run(self.engine.aclose())
            for p in self.providers.values():
                self.run(p.app.state.worker.aclose())
        finally:
            for p in self.providers.values():
                p.stop()
            self.receiver.stop()
            self.logs.detach()
            self.store.close()
            self.loop.close()
            if self.objects is not None:
                self.objects.close()
