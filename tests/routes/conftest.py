"""`lowtide serve` as a subprocess (echo backend, a fast clock) for the provider batch routes,
and the route options that point the official SDKs at it."""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.store.db import Store

LOWTIDE = str(Path(sys.executable).with_name("lowtide"))
KEY_ENV = "LOWTIDE_TEST_PROVIDER_KEY"
ROUTES = ["openai-batch", "anthropic-batch"]


def _printed_url(proc: subprocess.Popen) -> str:
    """The server's base URL, from the Anthropic line of the banner it writes (to stderr)
    once it listens."""
    said = []
    for line in proc.stderr:
        if 'Anthropic(base_url="' in line:
            return line.split('base_url="', 1)[1].split('"', 1)[0]
        said.append(line)
    raise AssertionError("lowtide serve ended before printing its URLs: " + "".join(said)[-2000:])


@pytest.fixture
def serve(tmp_path, monkeypatch):
    """Start `lowtide serve` (echo backend, a fast clock); yields a function giving its URL."""
    monkeypatch.setenv(KEY_ENV, "test-key")
    procs = []

    def start(*extra: str) -> str:
        # Port 0: the server takes a free port itself and prints it; a port picked here and
        # bound there could be taken in between by another server, which the tests would
        # then talk to instead.
        proc = subprocess.Popen(
            [LOWTIDE, "serve", "--backend", "echo", "--port", "0", "--time-scale", "3600",
             "--db", str(tmp_path / "server.db"), "--data-dir", str(tmp_path / "server-data"), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs.append(proc)
        url = _printed_url(proc)
        said = collections.deque(maxlen=40)  # what it says later, kept for a failure's message
        threading.Thread(target=said.extend, args=(proc.stderr,), daemon=True).start()  # the pipe kept drained
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, "".join(said)
            try:
                httpx.get(f"{url}/v1/batches", headers={"Authorization": "Bearer x"}, timeout=1)
                return url
            except httpx.TransportError:
                time.sleep(0.05)  # bound, not yet accepting
        raise AssertionError("lowtide serve did not start")

    yield start
    for proc in procs:
        proc.terminate()
        try:  # a delayed answer (a fault) still in flight holds a graceful stop
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _options(route: str, url: str, **more) -> dict:
    if route == "openai-batch":
        return {"base_url": f"{url}/v1", "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2], **more}
    # The server's clock runs 3600x fast, so its creation times run ahead of ours: widen
    # the window Anthropic adoption matches in (the real API keeps real time).
    return {"base_url": url, "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2], "find_window": 10**7, **more}


def _run(store: Store, name: str, timeout: float = 300):  # a safety net for a hung run, not a timing
    async def go():
        async with Engine(store) as engine:
            return await asyncio.wait_for(drive(engine, name), timeout)

    return asyncio.run(go())
