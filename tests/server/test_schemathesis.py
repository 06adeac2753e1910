"""Schemathesis over serve's own `/openapi.json` (request bodies declared): whatever it
generates for every operation, valid or not, the server never answers 5xx. Bounded: a few
examples per operation, derandomized (the same cases every run: a CI failure replays)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.server.conftest import Running, running

EXAMPLES = 12


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[Running]:
    # Small limits: a generated body is never large, and the 413 paths are exercised too.
    with running(tmp_path_factory.mktemp("schemathesis"), max_request_bytes=256 * 1024, body_timeout=5.0) as s:
        yield s


def test_no_operation_answers_a_server_error(live):
    # One hypothesis run per operation and mode (valid inputs, then invalid ones); the
    # `schemathesis.pytest` loaders do not work with this pytest, the strategies do.
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 15
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _runner(live, operation, mode, failures)()
            except Unsatisfiable:  # nothing to make invalid (an operation without inputs)
                assert mode is GenerationMode.NEGATIVE, operation.label
    assert not failures, "\n".join(failures[:20])


def _runner(live: Running, operation, mode: GenerationMode, failures: list[str]):
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)
    def run(case) -> None:
        response = case.call(base_url=live.url, headers={"authorization": "Bearer k", "x-api-key": "k"}, timeout=30)
        if response.status_code >= 500:
            failures.append(f"{case.method} {case.formatted_path} ({mode.value}): {response.status_code} {response.text[:200]}")

    return run


def test_the_schema_declares_the_request_bodies(live):
    paths = httpx.get(f"{live.url}/openapi.json").json()["paths"]
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/batches", "/v1/messages/batches", "/v1/files"):
        assert "requestBody" in paths[path]["post"], path
