"""The one mapping from a chat completions body to an Anthropic Messages body
(routes/anthropic/translate.py), row by row of its table, and what it refuses by name."""

from __future__ import annotations

import pytest

from lowtide.core.endpoints import MESSAGES
from lowtide.core.types import Refusal, Request
from lowtide.routes.anthropic.translate import chat_to_messages
from lowtide.routes.anthropic.wire import anthropic_params


def chat(**body):
    return {"model": "claude-x", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]} | body


def test_system_and_developer_messages_become_system_blocks_in_order():
    out = chat_to_messages(chat(messages=[
        {"role": "system", "content": "A"}, {"role": "developer", "content": [{"type": "text", "text": "B"}]},
        {"role": "user", "content": "hi"},
    ]))  # fmt: skip
    assert out["system"] == [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]
    assert out["messages"] == [{"role": "user", "content": "hi"}]


def test_images_and_pdfs_become_blocks():
    parts = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}},
    ]
    out = chat_to_messages(chat(messages=[{"role": "user", "content": parts}]))
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}, "title": "a.pdf"},
    ]


def test_tool_history_and_tools_map():
    out = chat_to_messages(chat(
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
        ],
        tools=[{"type": "function", "function": {"name": "weather", "description": "d", "parameters": {"type": "object"}}}],
        tool_choice={"type": "function", "function": {"name": "weather"}}, parallel_tool_calls=False,
        stop="END", user="u-1", max_tokens=None, max_completion_tokens=64,
    ))  # fmt: skip
    assert out["messages"][1] == {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Oslo"}}]}
    assert out["messages"][2] == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "rain"}]}]}
    assert out["tools"] == [{"name": "weather", "description": "d", "input_schema": {"type": "object"}}]
    assert out["tool_choice"] == {"type": "tool", "name": "weather", "disable_parallel_tool_use": True}
    assert (out["stop_sequences"], out["metadata"], out["max_tokens"]) == (["END"], {"user_id": "u-1"}, 64)


@pytest.mark.parametrize(("given", "expected"), [("auto", "auto"), ("required", "any"), ("none", "none")])
def test_tool_choice_words(given, expected):
    assert chat_to_messages(chat(tool_choice=given))["tool_choice"] == {"type": expected}


@pytest.mark.parametrize(("body", "field"), [
    (chat(seed=1), "seed"),
    (chat(response_format={"type": "json_object"}), "response_format.type"),
    (chat(max_completion_tokens=2), "max_completion_tokens"),
    (chat(n=2), "n"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    (chat(messages=[{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]), "messages[1].role"),
    (chat(messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}]}]), "messages[0].content[0]"),
    (chat(messages=[{"role": "user", "content": "a", "name": "bob"}]), "messages[0].name"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}]}]), "messages[0].content[0].image_url.url"),
])  # fmt: skip
def test_what_has_no_mapping_is_refused_by_name(body, field):
    refused = chat_to_messages(body)
    assert isinstance(refused, Refusal) and refused.field == field, refused


def test_sampling_parameters_are_mapped_whether_or_not_the_sdk_declares_them():
    # The Messages API takes both; an anthropic release that stops declaring one (it did for
    # temperature) must not make a chat job's temperature a refusal, as a same-protocol
    # route carries it (routes/openai/wire.py).
    for key in ("temperature", "top_p"):
        assert chat_to_messages(chat(**{key: 0.5}))[key] == 0.5


def test_cache_prefix_adds_cache_control_without_removing_the_users():
    mine = {"type": "text", "text": "S1", "cache_control": {"type": "ephemeral"}}
    body = {"model": "c", "max_tokens": 8, "system": [mine, {"type": "text", "text": "S2"}], "messages": [{"role": "user", "content": "U"}]}
    params = anthropic_params(Request("a", MESSAGES, body), cache_ttl="1h")
    assert params["system"] == [mine, {"type": "text", "text": "S2"}]  # the user's marks stay as they are
    assert body["system"][1] == {"type": "text", "text": "S2"}  # the stored body is never changed
    plain = dict(body, system="S")
    assert anthropic_params(Request("a", MESSAGES, plain), cache_ttl="1h")["system"] == [
        {"type": "text", "text": "S", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    ]
    assert anthropic_params(Request("a", MESSAGES, plain))["system"] == "S"  # verbatim without cache_prefix
