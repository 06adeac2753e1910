"""What a request body holds beyond its text (core/input_bounds.py): images, parts with no
bound, prompt-cache writes; and the most one image is billed, per model family, with the
provider's documented figure."""

from __future__ import annotations

import pytest

from lowtide.core import fastjson
from lowtide.core.input_bounds import Scan, image_bound, longer_ttl, may_hold, scan


def test_images_in_every_endpoints_shape_are_counted():
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}]}]}
    responses = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}, {"type": "input_image", "file_id": "f"}]}]}
    messages = {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]}]}
    gemini = {"contents": [{"parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}, {"file_data": {"mime_type": "image/jpeg", "file_uri": "gs://b/x"}}]}]}
    assert [scan(b).images for b in (chat, responses, messages, gemini)] == [1, 2, 1, 2]


def test_a_tool_result_holding_an_image_counts_it():
    body = {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                        "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]}]}  # fmt: skip
    assert scan(body).images == 1


def test_schemas_and_tools_hold_no_parts():
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": {"properties": {"f": {"type": "file"}}}}},
        "tools": [{"type": "function", "function": {"parameters": {"properties": {"i": {"type": "image"}}}}}],
    }
    assert scan(body) == Scan()


@pytest.mark.parametrize(
    ("part", "what"),
    [
        ({"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}, "a PDF or other file, billed by its pages"),
        ({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "x"}}, "a PDF or other file"),
        ({"type": "file", "file": {"file_id": "file-1"}}, "a PDF or other file"),
        ({"type": "input_file", "file_url": "https://x/a.pdf"}, "a PDF or other file"),
        ({"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}, "audio, billed by its length at audio prices"),
        ({"fileData": {"mimeType": "video/mp4", "fileUri": "gs://b/v"}}, "video, billed by its length"),
        ({"inlineData": {"mimeType": "application/pdf", "data": "x"}}, "a application/pdf file, billed by its content"),
        ({"fileData": {"mimeType": "text/plain", "fileUri": "gs://b/t"}}, "a text/plain file, billed by its content"),
    ],
)
def test_what_has_no_bound_is_named(part, what):
    assert (scan({"messages": [{"role": "user", "content": [part]}]}).unbounded or "").startswith(what)


def test_text_documents_and_inline_text_are_bounded_by_their_characters():
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hello"}}
    inline = {"inlineData": {"mimeType": "text/plain", "data": "aGVsbG8="}}
    assert scan({"messages": [{"role": "user", "content": [doc, inline]}]}) == Scan()


def test_cache_writes_are_found_anywhere_at_their_longest_ttl():
    five = {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]}
    hour = {"tools": [{"name": "t", "input_schema": {}, "cache_control": {"type": "ephemeral", "ttl": "1h"}}], **five}
    top = {"cache_control": {"type": "ephemeral", "ttl": "5m"}, "messages": []}
    assert [scan(b).cache_ttl for b in (five, hour, top, {"messages": []})] == ["5m", "1h", "5m", None]
    assert (longer_ttl("5m", None), longer_ttl(None, "1h"), longer_ttl("5m", "1h"), longer_ttl(None, None)) == ("5m", "1h", "1h", None)


def test_a_body_whose_text_holds_no_marker_holds_nothing_to_scan():
    # The budget reads a stored body's text for the markers before walking it: every part and
    # cache write scan finds must leave one in the JSON text, in either spelling of a key.
    bodies = [
        {"messages": [{"role": "user", "content": [{"type": t}]}]} for t in ("image_url", "input_image", "image", "file", "input_file", "document", "input_audio")
    ] + [{"contents": [{"parts": [{k: {"mimeType": "video/mp4"}}]}]} for k in ("inlineData", "inline_data", "fileData", "file_data")] + [
        {"cache_control": {"type": "ephemeral"}},
    ]  # fmt: skip
    for body in bodies:
        assert scan(body) != Scan() and may_hold(fastjson.dumps(body)), body
    assert not may_hold(fastjson.dumps({"messages": [{"role": "user", "content": "a plain ticket"}], "max_tokens": 5}))


@pytest.mark.parametrize(
    ("model", "price_list", "tokens"),
    [
        ("gpt-4o", "openai", 85 + 8 * 170),  # 2 x 4 tiles of 512 px at most, after the 2048 / 768 scaling
        ("gpt-4o-2024-08-06", "openai", 1_445),
        ("openai/gpt-4o", "openrouter", 1_445),
        ("gpt-4o-mini", "openai", 2_833 + 8 * 5_667),
        ("gpt-4.1-nano", "openai", 3_779),  # 1,536 patches x 2.46
        ("gpt-5-mini", "openai", 2_489),  # 1,536 patches x 1.62
        ("gpt-5", "openai", 70 + 8 * 140),
        ("gpt-5.4", "openai", 48_169),  # not in the guide: its largest figure
        ("my-azure-deployment", "azure", 48_169),
        ("claude-3-5-sonnet-20241022", "anthropic", 1_600),
        ("claude-sonnet-4-20250514", "anthropic", 1_600),
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", "aws", 1_600),
        ("claude-opus-4-7", "anthropic", 5_000),  # 2,576 px on the long edge
        ("gemini-2.5-flash", "google", 16 * 258),
        ("gemini-3-pro-preview", "google", 2_240),
        ("gemini-1.5-pro", "google", 24 * 258),
    ],
)
def test_the_most_one_image_is_billed(model, price_list, tokens):
    bound = image_bound(model, price_list)
    assert bound is not None and bound.tokens == tokens and bound.source


def test_an_open_model_on_a_host_has_no_documented_most():
    assert image_bound("meta-llama/llama-4-scout-17b-16e-instruct", "groq") is None
    assert image_bound("pixtral-12b-2409", "mistral") is None
