"""`lowtide serve` as a subprocess (echo backend, a fast clock) for the provider batch routes,
and the route options that point the official SDKs at it."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def serve(tmp_path, monkeypatch):
    """Start `lowtide serve` (echo backend, a fast clock); yields a function giving its URL."""
    monkeypatch.setenv(KEY_ENV, "test-key")
    procs = []

    def start(*extra: str) -> str:
        port = _free_port()
        proc = subprocess.Popen(
            [LOWTIDE, "serve", "--backend", "echo", "--port", str(port), "--time-scale", "3600",
             "--db", str(tmp_path / "server.db"), "--data-dir", str(tmp_path / "server-data"), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                httpx.get(f"{url}/v1/batches", headers={"Authorization": "Bearer x"}, timeout=1)
                return url
            except httpx.TransportError:
                time.sleep(0.05)  # the server is still starting
        raise AssertionError("lowtide serve did not start")

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)


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
