from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from tests.server.conftest import running

KEY_ENV = "LOWTIDE_CONFORMANCE_KEY"


@pytest.fixture
def serve_in_front(tmp_path) -> Iterator[Callable[[str, str], str]]:
    """`lowtide serve` with an upstream backend (openai-compatible or anthropic) pointed at
    `upstream`; returns the server's URL. Stopped at the end of the test."""
    stack = contextlib.ExitStack()

    def start(upstream: str, backend: str) -> str:
        options = {"base_url": f"{upstream}/v1"} if backend == "openai-compatible" else {"base_url": upstream, "api_key_env": KEY_ENV}
        server = stack.enter_context(running(tmp_path / "serve", backend=backend, route_options=options))
        return server.url

    with stack:
        yield start
