"""The first calls a client makes, answered as the providers answer them (issue 33: the
SDKs' own suites found them missing): models list and lookup for OpenAI and Anthropic,
Anthropic's token count, OpenAI's stored chat completions (serve stores none). Each failed
at 2c0e660 with 404 "Unknown path" or 405. Clients at their defaults, strict validation."""

from __future__ import annotations

import anthropic
import openai
import pytest
from google import genai

from lowtide.core.genai_source import model_ids


def _openai(s) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="k", _strict_response_validation=True)


def _anthropic(s) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.url, api_key="k", _strict_response_validation=True)


def test_openai_lists_and_looks_up_models(server):
    c = _openai(server)
    listed = [m.id for m in c.models.list()]
    assert listed == model_ids("openai") and "gpt-4o-mini" in listed
    assert c.models.retrieve("gpt-4o-mini").object == "model"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.models.retrieve("no-such-model")
    with pytest.raises(openai.NotFoundError):  # a fine-tuned id (colons) is OpenAI's, not a Gemini method
        c.models.delete("ft:gpt-4o-mini:acme::abc123")


def test_anthropic_lists_pages_of_models_and_counts_tokens(server):
    c = _anthropic(server)
    everything = model_ids("anthropic")
    first = c.models.list(limit=2)
    assert [m.id for m in first.data] == everything[:2] and first.has_more
    assert [m.id for m in c.models.list()] == everything  # the SDK follows the pages
    assert c.models.retrieve(everything[0]).type == "model"
    with pytest.raises(anthropic.NotFoundError):
        c.models.retrieve("claude-no-such")
    counted = c.messages.count_tokens(model="claude-sonnet-4-5", messages=[{"role": "user", "content": "Hello there, Claude"}])
    assert counted.input_tokens > 0
    with pytest.raises(anthropic.BadRequestError, match="messages"):
        c.post("/v1/messages/count_tokens", body={"model": "claude-sonnet-4-5"}, cast_to=object)


def test_stored_chat_completions_are_an_empty_account(server):
    c = _openai(server)
    assert list(c.chat.completions.list()) == []
    with pytest.raises(openai.NotFoundError, match="No chat completion found"):
        c.chat.completions.retrieve("chatcmpl-123")
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.delete("chatcmpl-123")


def test_a_gemini_call_on_v1_models_is_still_geminis(server):
    client = genai.Client(api_key="k", http_options={"base_url": server.url})  # the SDK's default version, v1
    answer = client.models.generate_content(model="gemini-2.5-flash", contents="hello")
    assert answer.text == "hello"
