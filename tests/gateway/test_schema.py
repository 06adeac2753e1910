"""The gateway serves its OpenAPI schema at /openapi.json, request bodies declared, and a
bounded schemathesis run over it (every operation, 20 generated requests each, with
a tenant's key) finds no 5xx. The upstream is a stub that answers 200 to anything, so any
5xx would be the gateway's own."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest

from .conftest import KEYS, base_config, running_gateway, serving

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

EXAMPLES = 20
ANSWER = json.dumps({"id": "chatcmpl-stub", "object": "chat.completion", "created": 1, "model": "m", "choices": [],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()  # fmt: skip


async def _stub(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": ANSWER})


def test_the_schema_declares_the_request_bodies(tmp_path):
    with serving(_stub) as up, running_gateway(tmp_path, base_config(tmp_path, SimpleNamespace(url=up))) as g:
        schema = httpx.get(f"{g.url}/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/messages"):
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert "model" in body["required"] and "messages" in body["required"]
    assert "/v1/deferred/{gid}" in schema["paths"]


def test_schemathesis_finds_no_server_error(tmp_path):
    config = base_config(tmp_path, SimpleNamespace(url="http://127.0.0.1:9"), collector={"flush_age": 3600})
    with serving(_stub) as up:
        config["upstreams"] = base_config(tmp_path, SimpleNamespace(url=up))["upstreams"]
        with running_gateway(tmp_path, config) as g:
            schema = schemathesis.openapi.from_url(f"{g.url}/openapi.json")
            failures: list[str] = []
            seen: list[int] = []
            operations = [result.ok() for result in schema.get_all_operations()]
            assert len(operations) >= 5
            for operation in operations:

                @hypothesis.settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                                     suppress_health_check=list(hypothesis.HealthCheck))  # fmt: skip
                @hypothesis.given(case=operation.as_strategy())
                def check(case):
                    response = case.call(base_url=g.url, headers={"authorization": f"Bearer {KEYS['acme']}"}, timeout=30)
                    seen.append(response.status_code)
                    if response.status_code >= 500:
                        failures.append(f"{case.method} {case.formatted_path} → {response.status_code}: {response.text[:200]}")

                check()
    assert failures == []
    assert len(seen) >= 3 * len(operations), seen  # it did run
