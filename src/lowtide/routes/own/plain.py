"""What lowtide's own engines (`echo`, `echo-batch`, `local`, the Ray pool) take from a request.

They are not providers: they honour plain-text turns and a few parameters, and refuse
everything else by name (DESIGN invariant 8), before it runs. `read_plain` reads a chat
completions, responses, completions or Anthropic messages body into one `Plain` view, or
returns the `Refusal` for the first thing the route cannot honour.

`honours` is the route's own extra body keys per endpoint (say `seed`, `top_p`); the keys
every own engine honours are in `BASE_KEYS`. `n` above 1 is taken only where the route
honours `n` (it returns that many choices); `n: 1` is always taken.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lowtide.core.endpoints import CHAT, COMPLETIONS, GEMINI, MESSAGES, RESPONSES
from lowtide.core.types import Refusal, Request

# Per endpoint: the keys every own engine honours.
BASE_KEYS = {
    CHAT: frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "stop", "n"}),
    RESPONSES: frozenset({"model", "input", "instructions", "max_output_tokens", "temperature"}),
    COMPLETIONS: frozenset({"model", "prompt", "max_tokens", "temperature", "stop", "n"}),
    MESSAGES: frozenset({"model", "messages", "system", "max_tokens", "temperature", "stop_sequences"}),
    GEMINI: frozenset({"model", "contents", "systemInstruction", "generationConfig"}),
}
# Gemini keeps its sampling parameters in `generationConfig`: those an own engine honours.
GEMINI_CONFIG = frozenset({"maxOutputTokens", "temperature", "stopSequences", "candidateCount"})
GEMINI_ROLES = {"user": "user", "model": "assistant"}
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
TEXT_PARTS = {CHAT: ("text",), RESPONSES: ("input_text", "output_text"), MESSAGES: ("text",)}
# Keys on a text part that change nothing an own engine answers (a caching hint).
HARMLESS_PART_KEYS = frozenset({"type", "text", "cache_control"})
MAX_N = 128  # OpenAI's own limit on n
_MESSAGES_ROLES = {"user": "user", "assistant": "assistant"}
_NONE: frozenset[str] = frozenset()
_ROLE_CONTENT = frozenset({"role", "content"})  # the keys a message may have
_ROLE_CONTENT_TYPE = frozenset({"role", "content", "type"})  # a responses input item's
Honours = Mapping[str, frozenset[str]] | frozenset[str]


@dataclass(slots=True)
class Plain:
    """A request as an own engine runs it: text turns (role system, user or assistant) and
    the parameters it asked for. None means the body did not say (no limit is invented)."""

    messages: list[dict[str, str]]
    max_tokens: int | None = None
    temperature: float | None = None
    stop: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)  # the route's `honours` keys, as sent
    raw_prompt: str | None = None  # a completions prompt: text, not turns
    n: int = 1  # choices asked for (above 1 only where the route honours n)


class _Refused(Exception):
    def __init__(self, field: str, reason: str):
        self.refusal = Refusal(field, reason)


def read_plain(request: Request, honours: Honours = frozenset()) -> Plain | Refusal:
    endpoint, body = request.endpoint, request.body
    base = BASE_KEYS.get(endpoint)
    if base is None:
        return Refusal("endpoint", f"{endpoint} is not served by this route")
    if honours.__class__ is not frozenset:
        honours = honours.get(endpoint, _NONE)
    if not base.issuperset(body):  # (a set test in C first: most bodies have no other key)
        for key in body:
            if key not in base and key not in honours:
                return Refusal(key, "not honoured by this route; remove it or use a provider route that takes it")
    try:
        plain = _READERS[endpoint](body)
    except _Refused as refused:
        return refused.refusal
    n = body.get("n", 1)
    if "n" in honours:
        if type(n) is not int or not 1 <= n <= MAX_N:
            return Refusal("n", f"must be a whole number from 1 to {MAX_N}; got {n!r}")
        plain.n = n
    elif n != 1:
        return Refusal("n", f"this route returns one choice per request; got n={n!r}")
    plain.params = {} if honours.isdisjoint(body) else {k: body[k] for k in honours if k in body}
    return plain


def _text(content: Any, where: str, part_types: tuple[str, ...]) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise _Refused(where, "expected text or a non-empty list of text parts")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in part_types or not isinstance(part.get("text"), str):
            raise _Refused(f"{where}[{i}]", f"content part {kind or type(part).__name__!r} is not taken by this route (text only)")
        extra = set(part) - HARMLESS_PART_KEYS
        if extra:
            raise _Refused(f"{where}[{i}].{sorted(extra)[0]}", "not honoured by this route")
        texts.append(part["text"])
    return "\n".join(texts)


def _turns(messages: Any, roles: dict[str, str], part_types: tuple[str, ...], allowed: frozenset[str]) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise _Refused("messages", "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        if m.__class__ is dict and len(m) == 2:  # {role, content} of text, most messages: told at once
            role, content = m.get("role"), m.get("content")
            if role.__class__ is str and content.__class__ is str and role in roles:
                out.append({"role": roles[role], "content": content})
                continue
        out.append(_turn(m, i, roles, part_types, allowed))
    return out


def _turn(m: Any, i: int, roles: dict[str, str], part_types: tuple[str, ...], allowed: frozenset[str]) -> dict[str, str]:
    """Message `i`, read the general way (what `_turns` makes of one at once, it makes alike)."""
    role = m.get("role") if isinstance(m, dict) else None
    if not isinstance(role, str) or role not in roles:  # a list or object role is no key at all
        raise _Refused(f"messages[{i}].role", f"role {role!r} is not taken by this route (only {', '.join(roles)})")
    if len(m) != 2 or "content" not in m:  # anything but {role, content}: look closer
        extra = set(m) - allowed
        if extra:
            raise _Refused(f"messages[{i}].{sorted(extra)[0]}", "not honoured by this route")
    return {"role": roles[role], "content": _text(m.get("content"), f"messages[{i}].content", part_types)}


def _stops(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    raise _Refused(name, "must be a string or a list of strings")


def _limit(body: dict[str, Any], *names: str) -> int | None:
    """The output limit under the first of `names` the body has (null: none): a whole
    number of tokens, at least 1. Anything else is refused by name here, at the door: an
    engine that ran it would fail (a limit of "50" cuts no text), and with it, in a batch,
    every line beside it."""
    for name in names:
        if name in body:
            value = body[name]
            if value is not None and (value.__class__ is not int or value < 1):
                raise _Refused(name, f"must be a whole number of tokens, at least 1; got {value!r}")
            return value
    return None


def _temperature(body: dict[str, Any], name: str = "temperature") -> float | None:
    value = body.get(name)
    if value is not None and (value.__class__ not in (int, float) or not 0 <= value <= 2):
        raise _Refused(name, f"must be a number from 0 to 2; got {value!r}")
    return value


def _chat(body: dict[str, Any]) -> Plain:
    messages = _turns(body.get("messages"), CHAT_ROLES, TEXT_PARTS[CHAT], _ROLE_CONTENT)
    limit = _limit(body, "max_completion_tokens", "max_tokens")
    return Plain(messages, limit, _temperature(body), _stops(body.get("stop"), "stop"))


def _messages(body: dict[str, Any]) -> Plain:
    turns = []
    if body.get("system") is not None:
        turns.append({"role": "system", "content": _text(body["system"], "system", TEXT_PARTS[MESSAGES])})
    turns += _turns(body.get("messages"), _MESSAGES_ROLES, TEXT_PARTS[MESSAGES], _ROLE_CONTENT)
    return Plain(turns, _limit(body, "max_tokens"), _temperature(body), _stops(body.get("stop_sequences"), "stop_sequences"))


def _responses(body: dict[str, Any]) -> Plain:
    turns = []
    if body.get("instructions") is not None:
        turns.append({"role": "system", "content": _text(body["instructions"], "instructions", ("input_text",))})
    given = body.get("input")
    if isinstance(given, str):
        turns.append({"role": "user", "content": given})
    else:
        if isinstance(given, list):
            for i, item in enumerate(given):
                if isinstance(item, dict) and item.get("type", "message") != "message":
                    raise _Refused(f"input[{i}].type", f"input item {item['type']!r} is not taken by this route (messages only)")
        turns += _turns(given, CHAT_ROLES, TEXT_PARTS[RESPONSES], _ROLE_CONTENT_TYPE)
    return Plain(turns, _limit(body, "max_output_tokens"), _temperature(body))


def _completions(body: dict[str, Any]) -> Plain:
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise _Refused("prompt", "this route takes one prompt as text (not a list of prompts or token ids)")
    return Plain([{"role": "user", "content": prompt}], _limit(body, "max_tokens"), _temperature(body),
                 _stops(body.get("stop"), "stop"), raw_prompt=prompt)  # fmt: skip


def _gemini_text(content: Any, where: str) -> str:
    """A Content's text parts, joined (a part of any other kind is refused by its place)."""
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list) or not parts:
        raise _Refused(f"{where}.parts", "expected a non-empty list of parts")
    extra = sorted(set(content) - {"role", "parts"})
    if extra:
        raise _Refused(f"{where}.{extra[0]}", "not honoured by this route")
    texts = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or set(part) != {"text"} or not isinstance(part["text"], str):
            kind = sorted(part)[0] if isinstance(part, dict) and part else type(part).__name__
            raise _Refused(f"{where}.parts[{i}]", f"part {kind!r} is not taken by this route (text only)")
        texts.append(part["text"])
    return "\n".join(texts)


def _gemini(body: dict[str, Any]) -> Plain:
    turns = []
    if body.get("systemInstruction") is not None:
        turns.append({"role": "system", "content": _gemini_text(body["systemInstruction"], "systemInstruction")})
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise _Refused("contents", "expected a non-empty list of contents")
    for i, content in enumerate(contents):
        role = content.get("role", "user") if isinstance(content, dict) else None
        if not isinstance(role, str) or role not in GEMINI_ROLES:
            raise _Refused(f"contents[{i}].role", f"role {role!r} is not taken by this route (only user, model)")
        turns.append({"role": GEMINI_ROLES[role], "content": _gemini_text(content, f"contents[{i}]")})
    config = body.get("generationConfig") or {}
    if not isinstance(config, dict):
        raise _Refused("generationConfig", "must be an object")
    for key in config:
        if key not in GEMINI_CONFIG:
            raise _Refused(f"generationConfig.{key}", "not honoured by this route; remove it or use a provider route that takes it")
    if config.get("candidateCount", 1) != 1:
        raise _Refused("generationConfig.candidateCount", f"this route returns one candidate per request; got {config['candidateCount']!r}")
    try:
        limit, temperature = _limit(config, "maxOutputTokens"), _temperature(config)
    except _Refused as refused:  # named where it is: in generationConfig
        raise _Refused(f"generationConfig.{refused.refusal.field}", refused.refusal.reason) from None
    return Plain(turns, limit, temperature,
                 _stops(config.get("stopSequences"), "generationConfig.stopSequences"))  # fmt: skip


_READERS = {CHAT: _chat, MESSAGES: _messages, RESPONSES: _responses, COMPLETIONS: _completions, GEMINI: _gemini}
