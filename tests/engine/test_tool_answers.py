"""An answer that is a tool call is the answer: ingest checks its arguments against the
called tool's parameters (not the job's schema or choices, which apply to text), repairs an
invalid call once with the error as the call's result, in the endpoint's own shape, then
fails it. Answers are SDK-built bodies applied by the engine's own ingest."""

from __future__ import annotations

import json

import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam
from pydantic import TypeAdapter

from lowtide.engine.dispatch import dispatched_requests
from lowtide.routes import create_route
from tests.engine import answers as a
from tests.engine.answers import OFFLINE
from tests.engine.ledger_helpers import dispatch

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
CHAT = "/v1/chat/completions"


def tools(endpoint: str = CHAT, **more) -> dict:
    limit = {"/v1/responses": "max_output_tokens"}.get(endpoint, "max_tokens")
    return {limit: 64, "tools": [a.weather_tool(endpoint)], **more}


def called(name: str = "get_weather", arguments: str = a.args(city="Paris")) -> dict:
    return a.chat(a.choice(0, None, finish="tool_calls", calls=[("call_1", name, arguments)]))


@pytest.mark.parametrize("asks", [{"response_schema": SCHEMA}, {"choices": ["billing", "technical"]}, {}])
def test_a_valid_tool_call_succeeds_whatever_the_job_asks_of_text(store, clock, tmp_path, monkeypatch, asks):
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ["t", "x"], params=tools(), **asks)
    text = '{"label": "billing"}' if "response_schema" in asks else "billing"
    a.answer_all(store, job, {"t": called(), "x": a.chat(a.choice(0, text))})
    got = a.states(store)
    assert {c: r.state for c, r in got.items()} == {"t": "succeeded", "x": "succeeded"}
    assert got["t"].parsed is None and got["t"].error_code is None  # the call is in the response, not parsed text


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (called(arguments=a.args(days=2)), "tool call 1 (get_weather): does not match its parameters at (root): 'city' is a required property"),
        (called(arguments=a.args(city="Oslo", days="two")), "at days: 'two' is not of type 'integer'"),
        (called(arguments='{"city": "Oslo"'), "tool call 1 (get_weather): arguments are not valid JSON"),
        (called(name="get_time"), "tool call 1 (get_time) names no tool of the request (its tools: get_weather)"),
    ],
)  # fmt: skip
def test_an_invalid_tool_call_is_repaired_once_then_failed(store, clock, tmp_path, monkeypatch, answer, why):
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ["t"], params=tools())
    a.answer_all(store, job, {"t": answer})
    req = a.states(store)["t"]
    assert req.state == "pending" and req.error_code == "invalid_output" and why in req.error_message
    # The retry carries the call and its result (the error), as chat messages the SDK types accept.
    dispatch_id = dispatch(store, job, job.spec.route, ["t"])
    with store.begin() as conn:
        (retry,) = dispatched_requests(conn, dispatch_id)
    TypeAdapter(list[ChatCompletionMessageParam]).validate_python(retry.messages)
    assert create_route("openai-batch", OFFLINE).refusal(retry) is None
    made, result = retry.messages[-2:]
    assert made["role"] == "assistant" and made["tool_calls"][0]["id"] == "call_1"
    assert result == {"role": "tool", "tool_call_id": "call_1", "content": result["content"]} and why in result["content"]
    a.ingest_again(store, job, dispatch_id, {"t": answer})
    req = a.states(store)["t"]
    assert req.state == "failed" and "after one repair attempt" in req.error_message and why in req.error_message


def test_a_repaired_tool_call_that_is_valid_succeeds(store, clock, tmp_path, monkeypatch):
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ["t"], params=tools())
    a.answer_all(store, job, {"t": called(arguments="{}")})
    a.answer_all(store, job, {"t": called()})
    assert a.states(store)["t"].state == "succeeded"


def test_anthropic_tool_use_is_checked_and_repaired_with_a_tool_result(store, clock, tmp_path, monkeypatch):
    endpoint = "/v1/messages"
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ["ok", "bad"], endpoint=endpoint, params=tools(endpoint))
    a.answer_all(store, job, {
        "ok": a.message(a.tool_use("toolu_1", "get_weather", {"city": "Lima"}), stop="tool_use"),
        "bad": a.message(a.text_block("Checking."), a.tool_use("toolu_2", "get_weather", {"town": "Lima"}), stop="tool_use"),
    })  # fmt: skip
    got = a.states(store)
    assert got["ok"].state == "succeeded" and got["bad"].state == "pending"
    dispatch_id = dispatch(store, job, job.spec.route, ["bad"])
    with store.begin() as conn:
        (retry,) = dispatched_requests(conn, dispatch_id)
    TypeAdapter(list[MessageParam]).validate_python(retry.messages)
    assert create_route("anthropic-batch", {**OFFLINE, "base_url": "http://127.0.0.1:9"}).refusal(retry) is None
    made, result = retry.messages[-2:]
    assert [b["type"] for b in made["content"]] == ["text", "tool_use"]
    (block,) = result["content"]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_2" and block["is_error"] is True
    assert "'city' is a required property" in block["content"]


def test_responses_function_call_is_checked_and_repaired_with_its_output(store, clock, tmp_path, monkeypatch):
    endpoint = "/v1/responses"
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ["bad"], endpoint=endpoint, params=tools(endpoint))
    a.answer_all(store, job, {"bad": a.response(a.response_call("call_7", "get_weather", a.args(city=3)))})
    assert a.states(store)["bad"].state == "pending"
    dispatch_id = dispatch(store, job, job.spec.route, ["bad"])
    with store.begin() as conn:
        (retry,) = dispatched_requests(conn, dispatch_id)
    items = retry.body["input"]
    TypeAdapter(list[ResponseInputItemParam]).validate_python(items)
    made, result = items[-2:]
    assert made["type"] == "function_call" and made["call_id"] == "call_7"
    assert result["type"] == "function_call_output" and result["call_id"] == "call_7"
    assert "3 is not of type 'string'" in json.dumps(result["output"])
