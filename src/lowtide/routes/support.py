"""What each route does with each parameter, content part and role of each endpoint:
passes it through, translates it, honours it, or refuses it (DESIGN invariant 8).

Nothing here is a hand-kept list. The parameters, parts and roles are read from the official
SDKs' request types (their TypedDicts), a sample value is built for each from its annotation
(`sample`), and the route's own `refusal` is asked about a body carrying it. The same
samples drive the conformance tests (tests/conformance), and `markdown()` writes the table in
docs/support.md, which a test compares with this module's output: the docs cannot drift from
the code, and a parameter the SDKs add shows up in both the day it ships.

    python -m lowtide.routes.support > docs/support.md
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

import typing_extensions

from lowtide.core.cards import CARDS
from lowtide.core.endpoints import (
    CHAT,
    COMPLETIONS,
    GEMINI,
    MESSAGES,
    PROTOCOL,
    RESPONSES,
    known_keys,
    request_type,
    required_of,
)
from lowtide.core.native_schema import FORCED_TOOL
from lowtide.core.types import Request

# The routes the table covers, with the options that build them here (no network, no model).
ROUTES: dict[str, dict[str, Any]] = {
    "openai-batch": {"api_key_env": "LOWTIDE_SUPPORT_KEY"},
    "openai": {"api_key_env": "LOWTIDE_SUPPORT_KEY"},
    "openai-compatible": {"base_url": "http://127.0.0.1:9/v1"},
    "openai-compatible-batch": {"profile": "groq", "api_key_env": "LOWTIDE_SUPPORT_KEY"},
    "azure-batch": {"endpoint": "https://lowtide-support.openai.azure.com", "api_key_env": "LOWTIDE_SUPPORT_KEY"},
    "mistral-batch": {"api_key_env": "LOWTIDE_SUPPORT_KEY"},
    "digitalocean-batch": {"api_key_env": "LOWTIDE_SUPPORT_KEY"},
    "openrouter-batch": {"api_key_env": "LOWTIDE_SUPPORT_KEY"},
    "anthropic-batch": {"api_key_env": "LOWTIDE_SUPPORT_KEY"},
    "anthropic": {"api_key_env": "LOWTIDE_SUPPORT_KEY"},
    "gemini-batch": {"api_key_env": "LOWTIDE_SUPPORT_KEY"},
    "gemini": {"api_key_env": "LOWTIDE_SUPPORT_KEY"},
    "vertex-batch": {"project": "lowtide-support", "staging": "gs://lowtide-support/x", "access_token_env": "LOWTIDE_SUPPORT_KEY"},
    "bedrock-batch": {"role_arn": "arn:aws:iam::123456789012:role/lowtide-support", "staging": "s3://lowtide-support/x",
                      "region": "us-east-1"},
    "echo": {},
    "local": {},
}
OWN = frozenset({"echo", "echo-batch", "local"})
ENDPOINT_ORDER = (CHAT, RESPONSES, COMPLETIONS, MESSAGES, GEMINI)
# Each provider route's own protocol: a body of another protocol is translated (or refused).
ROUTE_PROTOCOL = {"anthropic": "anthropic", "anthropic-batch": "anthropic", "bedrock-batch": "anthropic", "gemini": "gemini",
                  "gemini-batch": "gemini", "vertex-batch": "gemini"}  # fmt: skip
# Routes whose provider takes more than one protocol's bodies as they are (OpenRouter batches
# chat completions and responses, and Anthropic's messages, each at its own endpoint).
ALSO_NATIVE = {"openrouter-batch": ("anthropic",)}


# Sample values from the SDKs' annotations ------------------------------------------------
# Text a field must look like to be read at all (a URL, a data URL); any other string is "x".
REALISTIC = {
    "url": "https://example.com/cat.png",
    "file_data": "data:application/pdf;base64,JVBERi0xLjQK",
    "data": "iVBORw0KGgo=",
}
# Gemini's generationConfig values: the REST body's nested values are the API's to judge and
# the routes pass them verbatim, so any value of the right kind serves; these read naturally.
GEMINI_SAMPLES = {"stopSequences": ["END"], "responseMimeType": "application/json", "responseModalities": ["TEXT"],
                  "temperature": 0.5, "topP": 0.9, "responseSchema": {"type": "OBJECT"}, "responseJsonSchema": {"type": "object"},
                  "thinkingConfig": {"thinkingBudget": 0}, "mediaResolution": "MEDIA_RESOLUTION_LOW"}  # fmt: skip
_WRAPPERS = (typing.Required, typing.NotRequired, typing.Annotated, typing_extensions.Required,
             typing_extensions.NotRequired, typing_extensions.Annotated)  # fmt: skip
def sample(tp: Any, depth: int = 0) -> Any:
    """A small JSON value of type `tp` (an SDK annotation): the first Literal, the first
    arm of a union, a one-item list, a TypedDict's required keys."""
    if depth > 12:
        return "x"
    origin, args = typing_extensions.get_origin(tp), typing_extensions.get_args(tp)
    if origin in _WRAPPERS:
        return sample(args[0], depth + 1)
    if origin is Literal:
        return args[0]
    if origin in (Union, types.UnionType):
        arms = [a for a in args if a is not type(None)]
        return sample(arms[0], depth + 1)
    if origin in (list, Iterable, Sequence):
        return [sample(args[0], depth + 1)] if args else []
    if origin in (dict, Mapping):
        return {"k": sample(args[1], depth + 1) if len(args) == 2 else "v"}
    if typing_extensions.is_typeddict(tp):
        hints = typing_extensions.get_type_hints(tp, include_extras=True)
        return {k: REALISTIC.get(k) or sample(hints[k], depth + 1) for k in sorted(required_of(tp))}
    return {str: "x", int: 1, float: 0.5, bool: True, object: "x", bytes: "eA=="}.get(tp, "x")


def params_type(endpoint: str) -> Any:
    return request_type(endpoint)


def sample_param(endpoint: str, key: str) -> Any:
    hints = typing_extensions.get_type_hints(params_type(endpoint), include_extras=True)
    return sample(hints[key])


def base_body(endpoint: str, model: str = "m") -> dict[str, Any]:
    """The least body of `endpoint` that runs everywhere it can: a model, one user turn, and
    an output limit (Anthropic requires one, so a chat body routed there needs it too)."""
    if endpoint == RESPONSES:
        return {"model": model, "input": "Say hi."}
    if endpoint == COMPLETIONS:
        return {"model": model, "prompt": "Say hi."}
    if endpoint == GEMINI:
        return {"model": model, "contents": [{"role": "user", "parts": [{"text": "Say hi."}]}]}
    return {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 16}


# Parameters that do what one of `base_body`'s keys does, tried in its place.
REPLACES = {"max_completion_tokens": "max_tokens"}


def param_keys(endpoint: str) -> list[str]:
    """The endpoint's keys beyond what `base_body` sets, sorted."""
    return sorted(known_keys(endpoint) - set(base_body(endpoint)))


def param_samples(endpoint: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(item, the keys to add to `base_body`) for each parameter of `endpoint`. Gemini's
    sampling parameters live inside `generationConfig`: one item each, as the SDK writes them."""
    if endpoint != GEMINI:
        for key in param_keys(endpoint):
            yield key, {key: sample_param(endpoint, key)}
        return
    from lowtide.core.gemini import rest_keys

    top, generation = rest_keys()
    for key in sorted(top - set(base_body(endpoint)) - {"generationConfig"}):
        yield key, {key: sample_param(endpoint, key)}
    for key in sorted(generation):
        yield f"generationConfig.{key}", {"generationConfig": {key: GEMINI_SAMPLES.get(key, 1)}}


def union_arms(tp: Any) -> list[Any]:
    """The TypedDicts a union annotation (or an Iterable of one) allows."""
    origin, args = typing_extensions.get_origin(tp), typing_extensions.get_args(tp)
    if origin in _WRAPPERS:
        return union_arms(args[0])
    if origin in (list, Iterable, Sequence):
        return union_arms(args[0])
    if origin in (Union, types.UnionType):
        return [a for arm in args for a in union_arms(arm)]
    return [tp] if typing_extensions.is_typeddict(tp) else []


def message_samples(endpoint: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, message) for each message type of a chat or messages body, and for each
    content part type inside a user message: every role and part the SDK knows."""
    hints = typing_extensions.get_type_hints(params_type(endpoint), include_extras=True)
    for arm in union_arms(hints["messages"]):
        message = sample(arm)
        yield f"role {message.get('role')}", message
        content = typing_extensions.get_type_hints(arm, include_extras=True).get("content")
        if content is None or message.get("role") not in ("user",):
            continue
        for part in union_arms(content):
            value = sample(part)
            yield f"part {value.get('type')}", message | {"content": [value]}


def conversation_with(message: dict[str, Any], user: dict[str, Any]) -> list[dict[str, Any]]:
    """A conversation holding `message` where its role goes: a user message alone, a system
    or developer message before the user's turn, any other after it."""
    role = message.get("role")
    if role == "user":
        return [message]
    return [message, user] if role in ("system", "developer") else [user, message]


# The table ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Verdict:
    route: str
    endpoint: str
    item: str  # a parameter, "role developer", "part image_url"
    action: str  # passes, translates, honours, refused
    why: str = ""


def _route(name: str):
    from lowtide.routes import create_route

    os.environ.setdefault("LOWTIDE_SUPPORT_KEY", "sk-support-table")
    if name != "bedrock-batch":
        return create_route(name, ROUTES.get(name, {}))
    # boto3 reads credentials from the environment only: lent for the route's making, then put back
    lent = {"AWS_ACCESS_KEY_ID": "AKIASUPPORTTABLE", "AWS_SECRET_ACCESS_KEY": "support-table-secret", "AWS_EC2_METADATA_DISABLED": "true"}
    before = {k: os.environ.get(k) for k in lent}
    os.environ.update({k: v for k, v in lent.items() if before[k] is None})
    try:
        return create_route(name, ROUTES[name])
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)


def action(route: Any, name: str, endpoint: str, body: dict[str, Any]) -> tuple[str, str]:
    refused = route.refusal(Request("support", endpoint, body))
    if refused is not None:
        return "refused", refused.reason
    if name in OWN:
        return "honours", ""
    native = PROTOCOL[endpoint] == ROUTE_PROTOCOL.get(name, "openai") or PROTOCOL[endpoint] in ALSO_NATIVE.get(name, ())
    return ("passes", "") if native else ("translates", "")


def verdicts(routes: Iterable[str] = ROUTES) -> Iterator[Verdict]:
    for name in routes:
        route = _route(name)
        for endpoint in ENDPOINT_ORDER:
            base = base_body(endpoint)
            act, why = action(route, name, endpoint, base)
            yield Verdict(name, endpoint, f"(a request: {', '.join(base)})", act, why)
            if act == "refused":
                continue
            for key, value in param_samples(endpoint):
                # a parameter that stands in for one of the base's (the other output limit) replaces it:
                # both at once is refused everywhere that takes one limit, which is not the parameter's verdict
                sent = {k: v for k, v in base.items() if k != REPLACES.get(key)} | value
                yield Verdict(name, endpoint, key, *action(route, name, endpoint, sent))
            if endpoint in (CHAT, MESSAGES):
                for item, message in message_samples(endpoint):
                    messages = conversation_with(message, base["messages"][0])
                    yield Verdict(name, endpoint, item, *action(route, name, endpoint, base | {"messages": messages}))


# What a job's `response_schema` and `choices` are sent as ---------------------------------
SAMPLE_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"], "additionalProperties": False}
SAMPLE_CHOICES = ["yes", "no"]


def _asked(body: dict[str, Any]) -> list[str]:
    """The structured-output fields a body sent to a provider carries, in words."""
    out = []
    fmt = body.get("response_format")
    if isinstance(fmt, dict):
        strict = (fmt.get("json_schema") or {}).get("strict")
        out.append(f"`response_format` {fmt.get('type')}" + (", strict" if strict else ", not strict"))
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        out.append(f"`text.format` {text['format'].get('type')}" + (", strict" if text["format"].get("strict") else ", not strict"))
    config = body.get("output_config")
    if isinstance(config, dict) and isinstance(config.get("format"), dict):
        out.append(f"`output_config.format` {config['format'].get('type')}")
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("name") == FORCED_TOOL:
        out.append(f"forced tool `{FORCED_TOOL}`")
    gen = body.get("generationConfig")
    if isinstance(gen, dict):
        for key in ("responseJsonSchema", "responseSchema"):
            if key in gen:
                out.append(f"`{key}` ({gen.get('responseMimeType')})")
    return out


def sent_as(name: str, route: Any, endpoint: str, choices: list[str] | None, schema: dict[str, Any] | None) -> str:
    """What `route` sends for a job of `endpoint` with these `choices` / `response_schema`:
    the body the loader renders (engine/loader.py `request_base`), as the route's own
    mapping sends it; or what an own engine does with it."""
    from lowtide.core.native_schema import ask_of, with_ask
    from lowtide.routes.anthropic.translate import chat_to_messages
    from lowtide.routes.gemini.wire import from_chat

    base = base_body(endpoint)
    if route.refusal(Request("support", endpoint, base)) is not None:
        return "—"
    ask = ask_of(choices, schema)
    body = base if ask is None else with_ask(base, endpoint, ask)
    refused = route.refusal(Request("support", endpoint, body, choices, schema))
    if refused is not None:
        return f"refused: {refused.field}"
    if name in OWN:
        if choices and name == "local":
            return "scores the choices"
        return "honours " + (", ".join(_asked(body)) or ("the choices" if choices else "`response_schema`"))
    wire = body
    if endpoint == CHAT and ROUTE_PROTOCOL.get(name) == "anthropic":
        wire = chat_to_messages(body)
    elif endpoint == CHAT and ROUTE_PROTOCOL.get(name) == "gemini":
        wire = from_chat(body)
    said = _asked(wire) if isinstance(wire, dict) else []
    return ", ".join(said) if said else "nothing: checked after"


def asks_markdown() -> list[str]:
    out = [
        "## What `response_schema` and `choices` are sent as",
        "",
        "A job's `response_schema` (an object at the root) and `choices` are asked for in each",
        "endpoint's own structured-output field (`src/lowtide/core/native_schema.py`); the answer is",
        "checked after on every route. `choices` go to OpenAI and Anthropic as `{\"choice\": <enum>}`",
        "(unwrapped before they are checked and stored), to Gemini as `text/x.enum`. `strict` is set",
        "where the schema meets OpenAI's strict-mode rules, else the schema is sent not strict. A",
        "field the job's params (or a row's own body) set already is sent as it is. —: the route",
        "takes no request of that endpoint. The table is for a current model; an Anthropic model",
        "before Claude 4.5 (which refuses `output_config.format`) is asked through a forced tool,",
        f"`{FORCED_TOOL}`, whose input is the answer, unless the request has tools of its own or",
        "extended thinking on (then the answer is checked after).",
        "",
    ]
    names = list(ROUTES)
    routes = {n: _route(n) for n in names}
    for title, choices, schema in (("response_schema", None, SAMPLE_SCHEMA), ("choices", SAMPLE_CHOICES, None)):
        out += [f"### {title}", "", "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for endpoint in ENDPOINT_ORDER:
            cells = [sent_as(n, routes[n], endpoint, choices, schema) for n in names]
            out.append(f"| {endpoint} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def _cell(value: Any, unconfirmed: bool = False) -> str:
    text = "—" if value is None else ("yes" if value is True else "no" if value is False else str(value))
    return (text + " (UNCONFIRMED)" if unconfirmed else text).replace("|", "\\|")


def _bytes(n: int | None) -> str | None:
    return None if n is None else next(f"{n // s:,} {u}" for u, s in (("GB", 2**30), ("MB", 2**20), ("B", 1)) if n % s == 0)


def _time(s: int | None) -> str | None:
    return None if s is None else next(f"{s // k:,} {u}" for u, k in (("d", 86400), ("h", 3600), ("s", 1)) if s % k == 0)


def _share(card: Any) -> str | None:
    factor = card.discount.factor if card.discount else None
    return None if factor is None else f"{(factor * 100).normalize():f}%"


def cards_markdown() -> list[str]:
    """Each route's capability card (core/cards.py), as tables: `lowtide routes NAME` shows one whole."""
    names = list(CARDS)
    rows: list[tuple[str, Any]] = [
        ("kind", lambda c: c.kind), ("provider", lambda c: c.provider),
        ("requests a batch", lambda c: None if c.limits.max_requests is None else f"{c.limits.max_requests:,}"),
        ("bytes a batch", lambda c: _bytes(c.limits.max_bytes)), ("bytes inline", lambda c: _bytes(c.limits.inline_bytes)),
        ("custom_id", lambda c: c.limits.custom_id_pattern or c.limits.custom_id_max),
        ("one model a batch", lambda c: c.limits.one_model_per_batch if c.kind == "batch" else None),
        ("enqueued tokens", lambda c: c.limits.enqueued_tokens),
        ("line", lambda c: c.lines and c.lines.input), ("result key", lambda c: c.lines and c.lines.result_key),
        ("found after a crash", lambda c: c.recovery and f"{c.recovery.how}" + (f" (`{c.recovery.field}`)" if c.recovery.field else "")),
        ("expired after", lambda c: _time(c.retention.window_s)), ("results kept", lambda c: _time(c.retention.results_s)),
        ("inputs kept", lambda c: _time(c.retention.inputs_s)),
        ("an expired batch keeps", lambda c: c.ends and c.ends.expired),
        ("a cancelled batch keeps", lambda c: c.ends and c.ends.cancelled),
        ("share of real-time price", lambda c: _share(c) if c.kind == "batch" else None),
        ("stacks with cache prices", lambda c: c.discount.stacks_with_cache if c.kind == "batch" and c.discount else None),
        ("data processed", lambda c: c.privacy.residency), ("zero retention", lambda c: c.privacy.zero_retention),
    ]  # fmt: skip
    fields = {"requests a batch": "limits.max_requests", "bytes a batch": "limits.max_bytes", "custom_id": "limits.custom_id_max",
              "inputs kept": "retention.inputs_s", "results kept": "retention.results_s", "an expired batch keeps": "ends.expired",
              "a cancelled batch keeps": "ends.cancelled", "share of real-time price": "discount.factor",
              "stacks with cache prices": "discount.stacks_with_cache", "data processed": "privacy.residency",
              "zero retention": "privacy.zero_retention"}  # fmt: skip
    out = [
        "## What each route's provider allows and keeps",
        "",
        "Each route's capability card (`src/lowtide/core/cards.py`); `lowtide routes NAME` shows one whole,",
        "`lowtide routes --json` all of them. The planner keeps each batch within the card's limits; a",
        "`route_options.max_requests`, `max_bytes` or `inline_bytes` over them is refused before anything",
        "is sent. UNCONFIRMED: no primary source settled it (—: not known, or no such thing).",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for title, get in rows:
        field = fields.get(title)
        # (a direct route's discount is its flex tier's: not in this table)
        shown = [(get(c), field in c.unconfirmed and not (c.kind == "direct" and title.startswith(("share", "stacks")))) for c in CARDS.values()]
        cells = [_cell(v if v or v is False else None, unsure) for v, unsure in shown]
        out.append(f"| {title} | " + " | ".join(cells) + " |")
    out += ["", "### Provider states", "", "| route | state | read as |", "|---|---|---|"]
    for card in CARDS.values():
        out += [f"| {card.name} | {state} | {meaning} |" for state, meaning in card.status.items()]
    out.append("")
    return out


def markdown() -> str:
    rows = list(verdicts())
    out = [
        "# What each route does with each field",
        "",
        "Generated by `python -m lowtide.routes.support` from the official SDKs' request types and",
        "each route's own check (`src/lowtide/routes/support.py`); a test keeps this file current.",
        "",
        "- **passes**: sent to the provider exactly as given.",
        "- **translates**: sent in the route's protocol by its one mapping: `routes/anthropic/translate.py` (Anthropic), `routes/gemini/wire.py` (Gemini).",
        "- **honours**: lowtide's own engine (`echo`, `local`) acts on it.",
        "- **refused**: the request is refused before anything is submitted, naming the field and the route.",
        "",
    ]
    for endpoint in ENDPOINT_ORDER:
        names = list(ROUTES)
        cells: dict[tuple[str, str], str] = {}
        items: list[str] = []
        for v in rows:
            if v.endpoint != endpoint:
                continue
            if v.item not in items:
                items.append(v.item)
            cells[(v.item, v.route)] = v.action
        out += [f"## {endpoint}", "", "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for item in items:
            out.append(f"| {item} | " + " | ".join(cells.get((item, n), "refused") for n in names) + " |")
        out.append("")
    out += asks_markdown()
    out += cards_markdown()
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(), end="")
