"""The providers' result lines, exactly as batch-apis.md shows them, become the right outcomes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lowtide.core.errors import RouteError
from lowtide.core.types import Request
from lowtide.routes.anthropic.batch import batch_request, parse_result
from lowtide.routes.openai.batch import _parse, parse_result_line, request_line

OPENAI_OK = json.loads(
    '{"id":"batch_req_123","custom_id":"request-2","response":{"status_code":200,"request_id":"req_123",'
    '"body":{"id":"chatcmpl-123","object":"chat.completion","created":1711652795,"model":"gpt-4o-mini",'
    '"choices":[{"index":0,"message":{"role":"assistant","content":"Hello."},"logprobs":null,"finish_reason":"stop"}],'
    '"usage":{"prompt_tokens":22,"completion_tokens":2,"total_tokens":24,"prompt_tokens_details":{"cached_tokens":8}}}},"error":null}'
)


def test_openai_success_line_carries_text_and_the_providers_usage():
    o = parse_result_line(OPENAI_OK)
    assert (o.custom_id, o.ok, o.text, o.finish_reason) == ("request-2", True, "Hello.", "stop")
    assert (o.usage.input_tokens, o.usage.cached_input_tokens, o.usage.output_tokens) == (22, 8, 2)


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (429, "rate_limit_exceeded", True),
        (500, "server_error", True),
        (400, "invalid_request_error", False),
    ],
)
def test_openai_http_error_lines_are_classified(status, code, retryable):
    line = {
        "custom_id": "a",
        "response": {
            "status_code": status,
            "body": {"error": {"message": "nope", "type": code, "param": None, "code": None}},
        },
        "error": None,
    }
    o = parse_result_line(line)
    assert (o.ok, o.error_code, o.retryable) == (False, code, retryable)
    assert f"HTTP {status}: nope" == o.error_message


@pytest.mark.parametrize(
    ("code", "retryable"),
    [("batch_expired", True), ("batch_cancelled", True), ("request_timeout", True), ("bad", False)],
)
def test_openai_non_http_error_lines_are_classified(code, retryable):
    o = parse_result_line(
        {"custom_id": "a", "response": None, "error": {"code": code, "message": "m"}}
    )
    assert (o.ok, o.error_code, o.retryable) == (False, code, retryable)


@given(st.text(max_size=200))
def test_a_corrupt_openai_line_is_skipped_never_raised(text):
    outcome = _parse(text)
    assert outcome is None or outcome.custom_id


def test_openai_request_line_shape():
    r = Request.chat(
        "t-1",
        "gpt-x",
        [{"role": "user", "content": "hi"}],
        max_tokens=5,
        stop=["\n"],
        response_schema={"type": "object"},
    )
    line = request_line(r)
    assert (
        line["custom_id"] == "t-1"
        and line["method"] == "POST"
        and line["url"] == "/v1/chat/completions"
    )
    assert line["body"]["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert line["body"]["stop"] == ["\n"]


def test_anthropic_results_map_to_outcomes():
    ok = parse_result(
        "a",
        {
            "type": "succeeded",
            "message": {
                "content": [{"type": "text", "text": "billing"}],
                "stop_reason": "end_turn",
                "usage": {
                    "input_tokens": 11,
                    "output_tokens": 3,
                    "cache_creation_input_tokens": 4,
                    "cache_read_input_tokens": 6,
                },
            },
        },
    )
    assert (
        ok.ok,
        ok.text,
        ok.usage.input_tokens,
        ok.usage.cache_write_tokens,
        ok.usage.cached_input_tokens,
    ) == (True, "billing", 11, 4, 6)
    bad = parse_result(
        "b",
        {
            "type": "errored",
            "error": {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "max_tokens: …"},
            },
        },
    )
    assert (bad.ok, bad.error_code, bad.retryable) == (False, "invalid_request_error", False)
    busy = parse_result(
        "c",
        {
            "type": "errored",
            "error": {"type": "error", "error": {"type": "overloaded_error", "message": "x"}},
        },
    )
    assert busy.retryable
    assert parse_result("d", {"type": "canceled"}).error_code == "batch_cancelled"
    assert parse_result("e", {"type": "expired"}).retryable


def test_anthropic_request_puts_system_apart_and_caches_it_when_asked():
    r = Request.chat(
        "a",
        "claude-x",
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        stop=["x"],
        max_tokens=16,
    )
    body = batch_request(r, cache_prefix=True)
    assert body["params"]["system"] == [
        {"type": "text", "text": "S", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    ]
    assert body["params"]["messages"] == [{"role": "user", "content": "U"}]
    assert body["params"]["stop_sequences"] == ["x"]


def test_missing_key_names_the_variable(monkeypatch):
    from lowtide.routes import create_route

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(RouteError, match="set the environment variable OPENAI_API_KEY"):
        create_route("openai-batch", {})
    monkeypatch.setenv("MY_KEY", "k")
    assert create_route("openai-batch", {"api_key_env": "MY_KEY"}).name == "openai-batch"
