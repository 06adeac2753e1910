"""Reading a provider's whole answer body into one view: each choice's text, tool calls,
refusal, finish reason, log probabilities and reasoning, whichever endpoint it came from.

The stored response (`requests.response`) stays exactly as the provider sent it; this is a
read-only view of it for the export and for checking tool calls at ingest. The body's
shape says what it is, so no endpoint needs to be stored beside it:

| body | a choice is | text | tool calls | refusal | finish | logprobs | reasoning |
|---|---|---|---|---|---|---|---|
| chat completion (`choices[].message`) | each of `choices` | `message.content` | `message.tool_calls` (function and custom) | `message.refusal` | `finish_reason` | `logprobs.content` | `message.reasoning_content` / `reasoning` (vLLM, DeepSeek) |
| completion (`choices[].text`) | each of `choices` | `text` | - | - | `finish_reason` | `logprobs` (tokens, token_logprobs, top_logprobs) | - |
| response (`object: "response"`) | the one response | `message` items' `output_text` parts | `function_call`, `custom_tool_call` items | `refusal` parts | `status` (`incomplete_details.reason` if incomplete) | `output_text` parts' `logprobs` | `reasoning` items' summary and text |
| Anthropic message (`type: "message"`) | the one message | `text` blocks, and a call of lowtide's forced tool (its `input` as JSON text: core/native_schema.py) | other `tool_use` blocks (`input` as JSON text) | - (`stop_reason` says `refusal`) | `stop_reason` | - | `thinking` blocks |
| Gemini `GenerateContentResponse` (`candidates[]`) | each of `candidates` | `text` parts but thoughts | `functionCall` parts (`args` as JSON text) | - (`finishReason` says `SAFETY`, …) | `finishReason` | `logprobsResult.chosenCandidates` (with `topCandidates`) | `text` parts marked `thought` |

A tool call is `{id, type, name, arguments}`: `type` is `function` (arguments: the JSON text
the provider sent; an Anthropic `input` object written as JSON) or `custom` (free text).
A log probability is `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`.
Every value is of the one type its field has (text, float, list of ints), or None where the
provider sent something else, so the view has fixed types (the export's Parquet columns).
Anything else the provider returned (usage, annotations, server tool blocks, …) is in the
stored response itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lowtide.core.native_schema import forced_text

# What the view reads, by the SDK types' own `type` names; everything else (server tool
# blocks, shell or computer calls, MCP items, …) stays in the stored response alone.
CHAT_TOOL_CALLS_READ = frozenset({"function", "custom"})
RESPONSE_ITEMS_READ = frozenset({"message", "function_call", "custom_tool_call", "reasoning"})
RESPONSE_PARTS_READ = frozenset({"output_text", "refusal"})
ANTHROPIC_BLOCKS_READ = frozenset({"text", "thinking", "tool_use"})
GEMINI_PARTS_READ = frozenset({"text", "thought", "functionCall"})  # a Part's keys (camelCase, as sent)

TOOL_CALL_KEYS = ("id", "type", "name", "arguments")
LOGPROB_KEYS = ("token", "logprob", "bytes", "top_logprobs")
CHOICE_KEYS = ("index", "text", "tool_calls", "refusal", "finish_reason", "logprobs", "reasoning")


@dataclass(slots=True)
class Choice:
    index: int = 0
    text: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    refusal: str | None = None
    finish_reason: str | None = None
    logprobs: list[dict[str, Any]] | None = None
    reasoning: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in CHOICE_KEYS}


@dataclass(slots=True)
class Answer:
    """Every choice of one response, in order (one for responses and Anthropic messages)."""

    choices: list[Choice] = field(default_factory=list)

    @property
    def first(self) -> Choice:
        return self.choices[0] if self.choices else Choice()


def read_answer(data: Any) -> Answer:
    """The view of a stored response body; an empty Answer for anything else."""
    if not isinstance(data, dict):
        return Answer()
    choices = data.get("choices")
    if isinstance(choices, list):
        return Answer([_openai_choice(i, c) for i, c in enumerate(choices) if isinstance(c, dict)])
    if data.get("type") == "message" and isinstance(data.get("content"), list):
        return Answer([_anthropic(data)])
    if isinstance(data.get("output"), list):
        return Answer([_response(data)])
    candidates = data.get("candidates")
    if isinstance(candidates, list):
        return Answer([_gemini(i, c) for i, c in enumerate(candidates) if isinstance(c, dict)])
    return Answer()


def tool_calls(data: Any) -> list[dict[str, Any]]:
    """The first choice's tool calls (ingest's check, on every answer: a chat completion
    without any is told in a few lookups); [] when it made none."""
    if not isinstance(data, dict):
        return []
    choices = data.get("choices")
    if isinstance(choices, list):
        first = choices[0] if choices and isinstance(choices[0], dict) else {}
        message = first.get("message")
        if not isinstance(message, dict) or not message.get("tool_calls"):
            return []
    return read_answer(data).first.tool_calls or []


def _str(value: Any) -> str | None:
    return (
        value if value is None or isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    )


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _ints(value: Any) -> list[int] | None:
    return value if isinstance(value, list) and all(type(b) is int for b in value) else None


def _openai_choice(i: int, c: dict[str, Any]) -> Choice:
    index = c.get("index")
    choice = Choice(index if type(index) is int else i, finish_reason=_str(c.get("finish_reason")))
    message = c.get("message")
    if isinstance(message, dict):  # chat completion
        choice.text = _str(message.get("content"))
        choice.refusal = _str(message.get("refusal"))
        choice.reasoning = _str(message.get("reasoning_content", message.get("reasoning")))
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            choice.tool_calls = [_chat_call(t) for t in calls if isinstance(t, dict)]
        lp = c.get("logprobs")
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            choice.logprobs = [_logprob(t) for t in lp["content"] if isinstance(t, dict)]
    else:  # completion
        choice.text = _str(c.get("text"))
        choice.logprobs = _completion_logprobs(c.get("logprobs"))
    return choice


def _chat_call(t: dict[str, Any]) -> dict[str, Any]:
    if t.get("type") == "custom":
        custom = _dict(t.get("custom"))
        return {
            "id": _str(t.get("id")),
            "type": "custom",
            "name": _str(custom.get("name")),
            "arguments": _str(custom.get("input")),
        }
    fn = _dict(t.get("function"))
    return {
        "id": _str(t.get("id")),
        "type": "function",
        "name": _str(fn.get("name")),
        "arguments": _str(fn.get("arguments")),
    }


def _logprob(t: dict[str, Any]) -> dict[str, Any]:
    top = t.get("top_logprobs")
    return {
        "token": _str(t.get("token")), "logprob": _num(t.get("logprob")), "bytes": _ints(t.get("bytes")),
        "top_logprobs": [
            {"token": _str(x.get("token")), "logprob": _num(x.get("logprob")), "bytes": _ints(x.get("bytes"))} for x in top if isinstance(x, dict)
        ] if isinstance(top, list) else None,
    }  # fmt: skip


def _completion_logprobs(lp: Any) -> list[dict[str, Any]] | None:
    """A completion's parallel lists (tokens, token_logprobs, top_logprobs as {token: logprob})
    as one entry per token, in the chat shape."""
    if not isinstance(lp, dict) or not isinstance(lp.get("tokens"), list):
        return None
    tokens, values, tops = (
        lp["tokens"],
        lp.get("token_logprobs") or [],
        lp.get("top_logprobs") or [],
    )
    out = []
    for i, token in enumerate(tokens):
        top = tops[i] if i < len(tops) else None
        out.append({
            "token": _str(token), "logprob": _num(values[i]) if i < len(values) else None, "bytes": None,
            "top_logprobs": [{"token": _str(k), "logprob": _num(v), "bytes": None} for k, v in top.items()] if isinstance(top, dict) else None,
        })  # fmt: skip
    return out or None


def _response(data: dict[str, Any]) -> Choice:
    texts: list[str] = []
    refusals: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    logprobs: list[dict[str, Any]] = []
    for item in data["output"]:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "message":
            for part in _list(item.get("content")):
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "output_text":
                    texts.append(part.get("text") or "")
                    if isinstance(part.get("logprobs"), list):
                        logprobs.extend(
                            _logprob(t) for t in part["logprobs"] if isinstance(t, dict)
                        )
                elif part.get("type") == "refusal":
                    refusals.append(part.get("refusal") or "")
        elif kind == "function_call":
            calls.append({"id": _str(item.get("call_id")), "type": "function", "name": _str(item.get("name")),
                          "arguments": _str(item.get("arguments"))})  # fmt: skip
        elif kind == "custom_tool_call":
            calls.append({"id": _str(item.get("call_id")), "type": "custom", "name": _str(item.get("name")),
                          "arguments": _str(item.get("input"))})  # fmt: skip
        elif kind == "reasoning":
            for part in _list(item.get("summary")) + _list(item.get("content")):
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    reasoning.append(part["text"])
    status = _str(data.get("status"))
    details = data.get("incomplete_details")
    if status == "incomplete" and isinstance(details, dict) and details.get("reason"):
        status = _str(details["reason"])
    return Choice(
        0, "".join(texts) if texts else None, calls or None, "".join(refusals) if refusals else None,
        status, logprobs or None, "\n".join(reasoning) if reasoning else None,
    )  # fmt: skip


def _anthropic(data: dict[str, Any]) -> Choice:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in data["content"]:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(block.get("text") or "")
        elif (forced := forced_text(block)) is not None:  # the answer, asked through a forced tool
            texts.append(forced)
        elif kind == "thinking":
            thinking.append(block.get("thinking") or "")
        elif kind == "tool_use":
            args = block.get("input")
            calls.append({"id": _str(block.get("id")), "type": "function", "name": _str(block.get("name")),
                          "arguments": json.dumps(args, ensure_ascii=False)})  # fmt: skip
    return Choice(
        0, "".join(texts) if texts else None, calls or None, None, _str(data.get("stop_reason")), None,
        "\n".join(thinking) if thinking else None,
    )  # fmt: skip


def _gemini(i: int, candidate: dict[str, Any]) -> Choice:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in _list(_dict(candidate.get("content")).get("parts")):
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            (thoughts if part.get("thought") is True else texts).append(part["text"])
        call = part.get("functionCall")
        if isinstance(call, dict):
            calls.append({"id": _str(call.get("id")), "type": "function", "name": _str(call.get("name")),
                          "arguments": json.dumps(call.get("args", {}), ensure_ascii=False)})  # fmt: skip
    index = candidate.get("index")
    return Choice(
        index if isinstance(index, int) and not isinstance(index, bool) else i,
        "".join(texts) if texts else None, calls or None, None, _str(candidate.get("finishReason")),
        _gemini_logprobs(candidate.get("logprobsResult")), "".join(thoughts) if thoughts else None,
    )  # fmt: skip


def _gemini_logprobs(result: Any) -> list[dict[str, Any]] | None:
    """`chosenCandidates[k]` is the k-th token; `topCandidates[k].candidates` its alternatives."""
    if not isinstance(result, dict) or not isinstance(result.get("chosenCandidates"), list):
        return None
    tops = _list(result.get("topCandidates"))
    out = []
    for k, chosen in enumerate(result["chosenCandidates"]):
        if not isinstance(chosen, dict):
            continue
        alternatives = _list(_dict(tops[k]).get("candidates")) if k < len(tops) else []
        out.append({
            "token": _str(chosen.get("token")), "logprob": _num(chosen.get("logProbability")), "bytes": None,
            "top_logprobs": [{"token": _str(t.get("token")), "logprob": _num(t.get("logProbability")), "bytes": None}
                             for t in alternatives if isinstance(t, dict)],
        })  # fmt: skip
    return out or None
