"""A Gemini batch's succeeded request whose kept answer is not in Gemini's shape (a row
stored before answers were kept, or a backend answering in another shape) gets a
GenerateContentResponse built from the text it kept, as OpenAI's lines do (`outputs.answer`).
Before, `response_of` read `Result.request` and `Result.finish`, which `Result` no longer
has: the whole responses file failed with an AttributeError."""

from __future__ import annotations

from lowtide.core import fastjson
from lowtide.core.endpoints import GEMINI
from lowtide.core.types import Usage
from lowtide.server.gemini_outputs import response_of
from lowtide.server.outputs import Result

BODY = {"model": "gemini-2.5-flash", "contents": [{"role": "user", "parts": [{"text": "hello"}]}],
        "generationConfig": {"maxOutputTokens": 8}}  # fmt: skip
PAYLOAD = fastjson.dumps({"endpoint": GEMINI, "body": BODY})  # as the store keeps a request


def test_an_answer_without_a_kept_gemini_response_is_built_from_its_text():
    r = Result("k1", "succeeded", "gemini-2.5-flash", text="kept text", usage=Usage(3, 0, 0, 2, 0), payload=PAYLOAD)
    body = response_of(r, "batches/b1", 1_700_000_000)
    assert body["candidates"][0]["content"]["parts"][0]["text"] == "kept text"
    assert body["usageMetadata"]["promptTokenCount"] == 3


def test_a_kept_gemini_response_is_taken_as_it_is():
    kept = {"candidates": [{"content": {"role": "model", "parts": [{"text": "as sent"}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 1}, "modelVersion": "gemini-2.5-flash"}  # fmt: skip
    r = Result("k1", "succeeded", "gemini-2.5-flash", text="as sent", response=kept)
    assert response_of(r, "batches/b1", 0) == kept
