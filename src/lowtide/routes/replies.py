"""The one answer builder: a whole answer body in the request's own endpoint's shape, as a
provider of that endpoint returns it (a chat completion, a response, a text completion, an
Anthropic message). lowtide's own engines (`echo`, `local`) build their `Outcome.response`
here; `lowtide serve` and the gateway build here the answer for a request whose route kept
no answer in its endpoint's shape (a chat request translated for an Anthropic route, a row
stored before answers were kept). One function per shape; the shapes are the SDKs' response
models' (tests/routes/test_replies.py validates each).

One `Reply` per choice (`n`): its text, or a tool call, why it ended, and (local) the
logprobs of its tokens, already in chat completions' `logprobs.content` shape. `Usage` is
lowtide's neutral form; each shape writes it in that provider's own terms.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from lowtide.core.endpoints import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    GEMINI,
    MESSAGES,
    MODERATIONS,
    RESPONSES,
)
from lowtide.core.types import Request, Usage

# lowtide's ending words are chat's ("stop", "length", "tool_calls", "content_filter"), plus
# "stop_sequence" (a stop string matched: chat says "stop"). Anthropic's, for a message:
ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "stop_sequence": "stop_sequence",
                  "content_filter": "refusal"}  # fmt: skip
# Any provider's word for why an answer ended, in lowtide's (responses: incomplete_details.reason).
FINISH_WORDS = {"end_turn": "stop", "max_tokens": "length", "tool_use": "tool_calls", "refusal": "content_filter",
                "pause_turn": "stop", "max_output_tokens": "length", "function_call": "tool_calls"}  # fmt: skip
# Gemini's finishReason, in lowtide's words (a function call ends with STOP there), and back.
GEMINI_FINISH = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter",
                 "BLOCKLIST": "content_filter", "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
                 "IMAGE_SAFETY": "content_filter"}  # fmt: skip
GEMINI_STOP = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "stop_sequence": "STOP",
               "content_filter": "SAFETY"}  # fmt: skip
# How each endpoint's answer says what it is: (key, value).
SHAPES = {CHAT: ("object", "chat.completion"), RESPONSES: ("object", "response"),
          COMPLETIONS: ("object", "text_completion"), MESSAGES: ("type", "message"),
          EMBEDDINGS: ("object", "list")}  # fmt: skip


@dataclass(slots=True)
class Call:
    """A function tool call: the tool's name and its arguments (a JSON value)."""

    name: str
    arguments: Any


@dataclass(slots=True)
class Reply:
    text: str = ""
    finish: str = "stop"  # lowtide's words (above)
    call: Call | None = None
    stop_sequence: str | None = None
    logprobs: list[dict[str, Any]] | None = None  # chat's logprobs.content entries
    output_tokens: int = 0


class Ids:
    """The ids of one answer: `prefix + stem (+ i)`. An own engine's stem is a function of
    the request (`own`), so one request's answer is the same each time."""

    __slots__ = ("stem",)

    def __init__(self, stem: str):
        self.stem = stem

    @classmethod
    def own(cls, route: str, custom_id: str) -> Ids:
        return cls(own_stem(route, custom_id))

    def __call__(self, prefix: str, i: int = 0) -> str:
        return f"{prefix}{self.stem}{i or ''}"


def own_stem(route: str, custom_id: str) -> str:
    return f"{route}{zlib.crc32(custom_id.encode()):08x}"


def arguments_text(arguments: Any) -> str:
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def finish_word(reason: Any) -> str:
    """A provider's finish / stop reason in lowtide's words ("stop" when it gave none)."""
    if not isinstance(reason, str) or not reason:
        return "stop"
    return FINISH_WORDS.get(reason, reason)


def in_shape(endpoint: str, response: Any) -> bool:
    """Whether `response` is an answer of `endpoint` (an Anthropic message kept for a chat
    request translated for an Anthropic route is not a chat completion)."""
    if endpoint == GEMINI:  # a GenerateContentResponse names no type: its candidates say it
        return isinstance(response, dict) and isinstance(response.get("candidates"), list)
    if endpoint == MODERATIONS:  # nor does a ModerationCreateResponse: its results say it
        return isinstance(response, dict) and isinstance(response.get("results"), list)
    key, value = SHAPES.get(endpoint, SHAPES[CHAT])
    return isinstance(response, dict) and response.get(key) == value


def finish_of(response: Any) -> str | None:
    """Why a kept answer (of any endpoint's shape) ended, in lowtide's words; None when it
    does not say (so the caller falls back on what it knows, e.g. the output limit)."""
    if not isinstance(response, dict):
        return None
    if response.get("type") == "message":
        return finish_word(response.get("stop_reason"))
    if response.get("object") == "response":
        details = response.get("incomplete_details")
        if isinstance(details, dict) and details.get("reason"):
            return finish_word(details["reason"])
        items = response.get("output") if isinstance(response.get("output"), list) else []
        return "tool_calls" if any(isinstance(i, dict) and i.get("type") == "function_call" for i in items) else "stop"
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return finish_word(choices[0].get("finish_reason"))
    candidates = response.get("candidates")
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
        reason = candidates[0].get("finishReason")
        parts = (candidates[0].get("content") or {}).get("parts") or []
        if any(isinstance(p, dict) and "functionCall" in p for p in parts):
            return "tool_calls"
        return GEMINI_FINISH.get(reason, "stop") if isinstance(reason, str) else None
    return None


def reply_body(request: Request, route: str, replies: list[Reply], usage: Usage, *, ids: Ids | None = None,
               created: int | None = None) -> dict[str, Any]:  # fmt: skip
    """The whole answer body for `request` (one entry of `replies` per choice), naming the
    request's model. Ids are `Ids.own(route, custom_id)` unless `ids` says; `created` is now
    unless given."""
    ids = ids or Ids.own(route, request.custom_id)
    created = int(time.time()) if created is None else created
    return _BUILDERS.get(request.endpoint, _chat)(request, ids, replies, usage, created)


def text_body(request: Request, text: str, finish: str, usage: Usage, *, ids: Ids, created: int) -> dict[str, Any]:
    """A one-choice answer of plain `text` (a route that kept only the text)."""
    reply = Reply(text=text, finish=finish_word(finish), output_tokens=usage.output_tokens)
    return reply_body(request, "", [reply], usage, ids=ids, created=created)


def chat_finish(finish: str) -> str:
    return "stop" if finish == "stop_sequence" else finish


def _chat(request: Request, ids: Ids, replies: list[Reply], usage: Usage, created: int) -> dict[str, Any]:
    choices = []
    for i, r in enumerate(replies):
        message: dict[str, Any] = {"role": "assistant", "content": None if r.call else r.text, "refusal": None}
        if r.call:
            message["tool_calls"] = [{"id": ids("call_", i), "type": "function",
                                      "function": {"name": r.call.name, "arguments": arguments_text(r.call.arguments)}}]  # fmt: skip
        logprobs = None if r.logprobs is None else {"content": r.logprobs, "refusal": None}
        choices.append({"index": i, "message": message, "finish_reason": chat_finish(r.finish), "logprobs": logprobs})
    return _with_tier({"id": ids("chatcmpl-"), "object": "chat.completion", "created": created, "model": request.model,
                       "choices": choices, "usage": _openai_usage(usage), "system_fingerprint": None}, request)  # fmt: skip


def chat_text_written(request: Request, route: str, text: str, finish: str, usage: Usage, content: str | None = None) -> str | None:
    """What `fastjson.dumps(reply_body(request, route, [Reply(text, finish)], usage))` writes
    for a chat request (one answer of text alone), written at once rather than built as dicts
    to be written later (echo's commonest answer: a `WrittenOutcome`). None where it is not
    written so simply: a request asking a service tier, or a text or model that orjson
    refuses (a lone surrogate: the whole body is then written by `json`, spaced). The same
    text, byte for byte (tests/routes/test_replies_written.py). `content`: `text` as a JSON
    string, where the caller has it (a choice's, written once per job)."""
    if request.body.get("service_tier") is not None:
        return None
    try:
        content = orjson.dumps(text).decode() if content is None else content
        model = _json_text(request.model)
    except TypeError:
        return None
    i, o = usage.input_tokens, usage.output_tokens
    return (
        f'{{"id":"chatcmpl-{own_stem(route, request.custom_id)}","object":"chat.completion","created":{int(time.time())},"model":{model},'
        f'"choices":[{{"index":0,"message":{{"role":"assistant","content":{content},"refusal":null}},'
        f'"finish_reason":"{chat_finish(finish)}","logprobs":null}}],'
        f'"usage":{{"prompt_tokens":{i},"completion_tokens":{o},"total_tokens":{i + o},'
        f'"prompt_tokens_details":{{"cached_tokens":{usage.cached_input_tokens}}},'
        f'"completion_tokens_details":{{"reasoning_tokens":{usage.reasoning_tokens}}}}},"system_fingerprint":null}}'
    )


@lru_cache(maxsize=64)  # a job's requests name one model or a few
def _json_text(value: str) -> str:
    return orjson.dumps(value).decode()


def _with_tier(answer: dict[str, Any], request: Request) -> dict[str, Any]:
    """`answer` with the `service_tier` an OpenAI answer reports where its request asked for
    one (`auto` is served at `default`, as OpenAI reports it), last; most ask none."""
    asked = request.body.get("service_tier")
    if asked is not None:
        answer["service_tier"] = "default" if asked == "auto" else asked
    return answer


def _completion(request: Request, ids: Ids, replies: list[Reply], usage: Usage, created: int) -> dict[str, Any]:
    choices = [{"index": i, "text": r.text, "finish_reason": chat_finish(r.finish), "logprobs": None}
               for i, r in enumerate(replies)]  # fmt: skip
    return {"id": ids("cmpl-"), "object": "text_completion", "created": created, "model": request.model,
            "choices": choices, "usage": _openai_usage(usage), "system_fingerprint": None}  # fmt: skip


def _openai_usage(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
            "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens}}  # fmt: skip


def _response(request: Request, ids: Ids, replies: list[Reply], usage: Usage, created: int) -> dict[str, Any]:
    (r,) = replies  # responses has no n
    cut = r.finish == "length"
    if r.call:
        item = {"type": "function_call", "id": ids("fc_"), "call_id": ids("call_"), "name": r.call.name,
                "arguments": arguments_text(r.call.arguments), "status": "completed"}  # fmt: skip
    else:
        part = {"type": "output_text", "text": r.text, "annotations": [], "logprobs": []}
        item = {"type": "message", "id": ids("msg_"), "status": "incomplete" if cut else "completed", "role": "assistant",
                "content": [part]}  # fmt: skip
    body = request.body
    return _with_tier({
        "id": ids("resp_"), "object": "response", "created_at": created, "model": request.model,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": [item], "error": None, "instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True), "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []), "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "usage": {"input_tokens": usage.input_tokens,
                  "input_tokens_details": {"cached_tokens": usage.cached_input_tokens, "cache_write_tokens": usage.cache_write_tokens},
                  "output_tokens": usage.output_tokens, "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
                  "total_tokens": usage.input_tokens + usage.output_tokens},
    }, request)  # fmt: skip


def _message(request: Request, ids: Ids, replies: list[Reply], usage: Usage, created: int) -> dict[str, Any]:
    (r,) = replies  # messages has no n
    if r.call:
        content = [{"type": "tool_use", "id": ids("toolu_"), "name": r.call.name, "input": r.call.arguments}]
    else:
        content = [{"type": "text", "text": r.text}]
    # Anthropic's input_tokens leave out cache reads (`anthropic/wire.anthropic_usage` reads them so).
    return {
        "id": ids("msg_"), "type": "message", "role": "assistant", "model": request.model, "content": content,
        "stop_reason": ANTHROPIC_STOP.get(r.finish, "end_turn"), "stop_sequence": r.stop_sequence,
        "usage": {"input_tokens": max(0, usage.input_tokens - usage.cached_input_tokens), "output_tokens": usage.output_tokens,
                  "cache_read_input_tokens": usage.cached_input_tokens, "cache_creation_input_tokens": usage.cache_write_tokens},
    }  # fmt: skip


def _gemini(request: Request, ids: Ids, replies: list[Reply], usage: Usage, created: int) -> dict[str, Any]:
    """A GenerateContentResponse (REST, camelCase): one candidate per reply. Gemini counts
    thoughts apart from candidates; lowtide's output tokens hold both."""
    candidates = []
    for i, r in enumerate(replies):
        part = {"functionCall": {"name": r.call.name, "args": r.call.arguments}} if r.call else {"text": r.text}
        candidates.append({"content": {"role": "model", "parts": [part]}, "finishReason": GEMINI_STOP.get(r.finish, "STOP"), "index": i})
    meta = {"promptTokenCount": usage.input_tokens, "candidatesTokenCount": usage.output_tokens - usage.reasoning_tokens,
            "totalTokenCount": usage.input_tokens + usage.output_tokens}  # fmt: skip
    if usage.cached_input_tokens:
        meta["cachedContentTokenCount"] = usage.cached_input_tokens
    if usage.reasoning_tokens:
        meta["thoughtsTokenCount"] = usage.reasoning_tokens
    return {"candidates": candidates, "usageMetadata": meta, "modelVersion": request.model, "responseId": ids("")}


_BUILDERS = {RESPONSES: _response, COMPLETIONS: _completion, MESSAGES: _message, GEMINI: _gemini}  # else chat
