"""An input file OpenAI would refuse fails the batch at validation, reported as OpenAI does:
`status: failed`, `errors: {"object": "list", "data": [{"code", "message", "param", "line"}]}`."""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import chat_line, create_batch, wait_openai


def _failed(client, items) -> list[dict]:
    batch = wait_openai(client, create_batch(client, items).id)
    assert batch.status == "failed"
    assert batch.failed_at is not None and batch.in_progress_at is None
    assert batch.output_file_id is None and batch.error_file_id is None
    assert batch.errors.object == "list"
    return [e.model_dump() for e in batch.errors.data]


@pytest.mark.parametrize(
    ("items", "code", "line", "param"),
    [
        pytest.param([chat_line("a"), '{"custom_id": "b", "method": "POST"', chat_line("c")], "invalid_json_line", 2, None, id="bad-json"),
        pytest.param([chat_line("a"), "[1, 2]"], "invalid_json_line", 2, None, id="not-an-object"),
        pytest.param([chat_line("a"), chat_line("b"), chat_line("a")], "duplicate_custom_id", 3, "custom_id", id="duplicate"),
        pytest.param([chat_line("a"), chat_line("b", url="/v1/embeddings")], "url_mismatch", 2, "url", id="url"),
        pytest.param([chat_line("a"), chat_line("b", model="gpt-other")], "model_mismatch", 2, "body.model", id="two-models"),
        pytest.param([{"method": "POST", "url": "/v1/chat/completions", "body": {}}], "invalid_request", 1, "custom_id", id="no-custom-id"),
        pytest.param([chat_line("a") | {"method": "GET"}], "invalid_request", 1, "method", id="method"),
        pytest.param([chat_line("a") | {"body": {"messages": []}}], "invalid_request", 1, "body.model", id="no-model"),
    ],
)
def test_a_bad_line_fails_the_batch_naming_the_line(server, items, code, line, param):
    errors = _failed(server.openai(), items)
    assert errors[0]["code"] == code
    assert errors[0]["line"] == line
    assert errors[0]["param"] == param
    assert errors[0]["message"]


def test_every_bad_line_is_reported(server):
    items = ["nope", chat_line("a"), "nope either", chat_line("a")]
    errors = _failed(server.openai(), items)
    assert [(e["code"], e["line"]) for e in errors] == [("invalid_json_line", 1), ("invalid_json_line", 3), ("duplicate_custom_id", 4)]


def test_an_empty_file_fails(server):
    errors = _failed(server.openai(), b"\n\n")
    assert [(e["code"], e["line"]) for e in errors] == [("empty_file", None)]


def test_more_than_50000_requests_fail(server):
    line = json.dumps(chat_line("X")).encode()
    data = b"".join(line.replace(b'"X"', f'"r{i}"'.encode()) + b"\n" for i in range(50_001))
    errors = _failed(server.openai(), data)
    assert [e["code"] for e in errors] == ["too_many_tasks"]
    assert "50,000" in errors[0]["message"]


def test_a_file_over_the_byte_limit_fails(serve):
    # The limit is OpenAI's 200 MB; lowered here so the test uploads kilobytes, not 200 MB.
    with serve(openai_max_bytes=1000) as s:
        errors = _failed(s.openai(), [chat_line(f"r{i}", "x" * 100) for i in range(10)])
    assert [e["code"] for e in errors] == ["file_too_large"]
    assert "1,000 bytes" in errors[0]["message"]


def test_the_default_limits_are_openais():
    from lowtide.server import ServeConfig

    config = ServeConfig()
    assert config.openai_max_requests == 50_000
    assert config.openai_max_bytes == 200 * 1024 * 1024
    assert config.anthropic_max_requests == 100_000
