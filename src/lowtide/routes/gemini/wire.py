"""The Gemini wire, shared by the `gemini` and `gemini-batch` routes: what a generateContent
body may carry, the one mapping from a chat completions body, and a GenerateContentResponse
read into an `Outcome`.

A body of lowtide's Gemini endpoint (`/v1beta/models:generateContent`, core/gemini.py) is
sent as it came. A chat completions body (what a templated job renders) is translated once,
here, by this table, and anything else in it is refused by name (DESIGN invariant 8):

| chat completions                       | Gemini generateContent                              |
|----------------------------------------|-----------------------------------------------------|
| `model`                                | `model`                                             |
| `messages[]` system / developer (text) | `systemInstruction.parts[].text` (joined in order)  |
| `messages[]` user / assistant (text)   | `contents[]` role `user` / `model`, `parts[].text`  |
| `max_tokens`, `max_completion_tokens`  | `generationConfig.maxOutputTokens`                  |
| `temperature`, `top_p`, `seed`         | `generationConfig.temperature`, `topP`, `seed`      |
| `stop` (text or list)                  | `generationConfig.stopSequences` (a list)           |
| `n`                                    | `generationConfig.candidateCount`                   |
| `presence_penalty`, `frequency_penalty`| `generationConfig.presencePenalty`, `frequencyPenalty` |
| `response_format` json_schema          | `responseMimeType: application/json` + `responseJsonSchema` |
| `response_format` of lowtide's choices (`{"choice": <enum>}`) | `responseMimeType: text/x.enum` + `responseSchema` `{type: STRING, enum}`: the bare choice |
| `response_format` json_object / text   | `responseMimeType: application/json` / `text/plain` |

Refused: every other key (tools, logprobs, ...), non-text content parts, tool turns, and a
system turn after the conversation began. Send a Gemini body (`endpoint:
/v1beta/models:generateContent` with `template.body_column`) for what the table lacks.
"""

from __future__ import annotations

from typing import Any

from lowtide.core.endpoints import CHAT, GEMINI, known_keys
from lowtide.core.gemini import generation_keys
from lowtide.core.native_schema import Ask, choices_of, gemini_config
from lowtide.core.types import Outcome, Refusal, Request, Usage
from lowtide.routes.replies import finish_of

# Gemini's HTTP statuses as its error `status` words, and which are worth another try.
RETRYABLE_STATUS = {"RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED", "ABORTED", "UNKNOWN"}
CHAT_CONFIG = {"max_tokens": "maxOutputTokens", "max_completion_tokens": "maxOutputTokens", "temperature": "temperature",
               "top_p": "topP", "seed": "seed", "n": "candidateCount", "presence_penalty": "presencePenalty",
               "frequency_penalty": "frequencyPenalty"}  # fmt: skip
CHAT_ROLES = {"user": "user", "assistant": "model"}
TIERS = {"flex": "flex", "priority": "priority", "standard": "realtime", "ON_DEMAND_FLEX": "flex",
         "ON_DEMAND_PRIORITY": "priority", "ON_DEMAND": "realtime"}  # fmt: skip


def gemini_body(request: Request, route: str) -> dict[str, Any] | Refusal:
    """The generateContent body `request` is sent as: its own, or its chat body translated."""
    if request.endpoint == GEMINI:
        return native_refusal(request.body) or request.body
    if request.endpoint != CHAT:
        return Refusal("endpoint", f"{request.endpoint} is not taken by {route}; use /v1/chat/completions or {GEMINI}")
    return from_chat(request.body)


def native_refusal(body: dict[str, Any]) -> Refusal | None:
    known = known_keys(GEMINI)
    for key in body:
        if key not in known:
            return Refusal(key, f"is not a field of Gemini's generateContent body (its fields: {', '.join(sorted(known))})")
    config = body.get("generationConfig")
    if config is not None:
        if not isinstance(config, dict):
            return Refusal("generationConfig", "must be an object")
        for key in config:
            if key not in generation_keys():
                return Refusal(f"generationConfig.{key}", f"is not a field of Gemini's GenerationConfig (its fields: {', '.join(sorted(generation_keys()))})")
    return None


def from_chat(body: dict[str, Any]) -> dict[str, Any] | Refusal:
    out: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for key, value in body.items():
        if key == "model":
            out["model"] = value
        elif key == "messages":
            continue
        elif key in CHAT_CONFIG:
            if CHAT_CONFIG[key] in config:
                return Refusal(key, f"gives {CHAT_CONFIG[key]} a second time; set one of max_tokens, max_completion_tokens")
            config[CHAT_CONFIG[key]] = value
        elif key == "stop":
            config["stopSequences"] = [value] if isinstance(value, str) else value
        elif key == "response_format":
            fmt = _format(value)
            if isinstance(fmt, Refusal):
                return fmt
            config.update(fmt)
        else:
            return Refusal(key, "has no Gemini mapping (docs/gemini.md); remove it, or send a Gemini generateContent body")
    turns = _contents(body.get("messages"))
    if isinstance(turns, Refusal):
        return turns
    system, contents = turns
    if system:
        out["systemInstruction"] = {"parts": system}
    out["contents"] = contents
    if config:
        out["generationConfig"] = config
    return out


def _format(value: Any) -> dict[str, Any] | Refusal:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return {"responseMimeType": "text/plain"}
    if kind == "json_object":
        return {"responseMimeType": "application/json"}
    if kind == "json_schema":
        schema = (value.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            return Refusal("response_format.json_schema.schema", "a json_schema format needs its schema")
        choices = choices_of(schema)
        if choices is not None:  # a job's choices: Gemini's own enum answer, no JSON around it
            return gemini_config(Ask(schema, tuple(choices)))
        return {"responseMimeType": "application/json", "responseJsonSchema": schema}
    return Refusal("response_format.type", f"{kind!r} has no Gemini mapping (text, json_object or json_schema)")


def _contents(messages: Any) -> tuple[list[dict[str, str]], list[dict[str, Any]]] | Refusal:
    if not isinstance(messages, list) or not messages:
        return Refusal("messages", "expected a non-empty list of messages")
    system: list[dict[str, str]] = []
    contents: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        extra = sorted(set(m) - {"role", "content"}) if isinstance(m, dict) else []
        if extra:
            return Refusal(f"messages[{i}].{extra[0]}", "has no Gemini mapping (docs/gemini.md)")
        parts = _parts(m.get("content") if isinstance(m, dict) else None, f"messages[{i}].content")
        if isinstance(parts, Refusal):
            return parts
        if role in ("system", "developer"):
            if contents:
                return Refusal(f"messages[{i}].role", "a system turn after the conversation began has no Gemini mapping")
            system += parts
        elif role in CHAT_ROLES:
            contents.append({"role": CHAT_ROLES[role], "parts": parts})
        else:
            return Refusal(f"messages[{i}].role", f"role {role!r} has no Gemini mapping (system, developer, user, assistant)")
    if not contents:
        return Refusal("messages", "Gemini needs at least one user or assistant turn")
    return system, contents


def _parts(content: Any, where: str) -> list[dict[str, str]] | Refusal:
    if isinstance(content, str):
        return [{"text": content}]
    if not isinstance(content, list) or not content:
        return Refusal(where, "expected text or a non-empty list of text parts")
    parts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or set(part) - {"type", "text"}:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            return Refusal(f"{where}[{i}]", f"content part {kind!r} has no Gemini mapping here (text parts only)")
        parts.append({"text": part["text"]})
    return parts


def gemini_usage(meta: Any) -> Usage:
    """usageMetadata in lowtide's terms: Gemini's prompt count holds its cached part (as
    OpenAI's does); thoughts are billed as output, so output holds them too."""
    meta = meta if isinstance(meta, dict) else {}

    def n(key: str) -> int:
        value = meta.get(key)
        return value if type(value) is int else 0

    thoughts = n("thoughtsTokenCount")
    return Usage(
        input_tokens=n("promptTokenCount") + n("toolUsePromptTokenCount"),
        cached_input_tokens=n("cachedContentTokenCount"),
        output_tokens=n("candidatesTokenCount") + thoughts,
        reasoning_tokens=thoughts,
    )


def gemini_outcome(custom_id: str, response: dict[str, Any], *, batch: bool = False) -> Outcome:
    """A GenerateContentResponse (REST shape) as an Outcome; the whole response is kept."""
    candidates = response.get("candidates")
    usage = gemini_usage(response.get("usageMetadata"))
    if not isinstance(candidates, list) or not candidates:
        feedback = response.get("promptFeedback") or {}
        reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
        outcome = Outcome.failure(custom_id, "prompt_blocked", f"Gemini returned no candidates (blockReason {reason or 'not given'})", False)
        outcome.usage, outcome.response = usage, response
        return outcome
    parts = ((candidates[0] or {}).get("content") or {}).get("parts") or []
    text = "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought"))
    meta = response.get("usageMetadata") if isinstance(response.get("usageMetadata"), dict) else {}
    tier = "batch" if batch else TIERS.get(meta.get("serviceTier") or meta.get("trafficType") or "")
    return Outcome(custom_id, True, text=text, usage=usage, finish_reason=finish_of(response), tier=tier, response=response)


def gemini_error(custom_id: str, error: Any) -> Outcome:
    """A Status (`{"code", "message", "status"}`) as a failed Outcome."""
    error = error if isinstance(error, dict) else {}
    status = error.get("status") if isinstance(error.get("status"), str) else None
    code = error.get("code")
    word = status or (f"http_{code}" if isinstance(code, int) else "unknown_error")
    message = error.get("message") if isinstance(error.get("message"), str) else word
    retryable = status in RETRYABLE_STATUS or (isinstance(code, int) and (code == 429 or code >= 500))
    return Outcome.failure(custom_id, word.lower() if status else word, message, retryable)
