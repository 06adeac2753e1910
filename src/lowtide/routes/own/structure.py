"""What a body asks of the answer's structure, read once for lowtide's own engines: JSON
against a schema, and which function tools exist and whether one must be called.

Each endpoint says it in its own words; these readers return one view (or the `Refusal` for
what an own engine cannot honour, naming the field):

| ask | chat completions | responses | completions | Anthropic messages | Gemini generateContent |
|---|---|---|---|---|---|
| JSON answer | `response_format` json_schema / json_object | `text.format` json_schema / json_object | — | `output_config.format` json_schema | `generationConfig.responseMimeType` application/json, with `responseJsonSchema` or `responseSchema` |
| one of a list, as bare text | — | — | — | — | `responseMimeType` text/x.enum with a schema's `enum` |
| function tools | `tools[].function` | `tools[]` of type function | — | `tools[]` (custom) | — |
| a call required | `tool_choice` required / named / allowed_tools required | same | — | `tool_choice` any / tool | — |

Gemini's `responseSchema` is its OpenAPI subset (`type: STRING`, `nullable`): read as the
JSON Schema it means (`gemini_json_schema`).

lowtide's own `response_schema` (`Request.response_schema`) counts where the body has no
JSON ask of its own (the loader puts it in the body where the endpoint has a field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lowtide.core.anthropic_schema import schema_problem_cached
from lowtide.core.endpoints import CHAT, GEMINI, MESSAGES, RESPONSES
from lowtide.core.native_schema import anthropic_structured
from lowtide.core.types import Refusal, Request


@dataclass(frozen=True, slots=True)
class JsonAsk:
    """The answer must be JSON: valid against `schema`, or (None) any JSON object.
    `field` is where the schema sits in the body, for refusals."""

    field: str
    schema: dict[str, Any] | bool | None
    bare: bool = False  # the answer is one of the schema's `enum` as bare text (Gemini's text/x.enum)


# generationConfig keys that say what the answer's structure is (Gemini).
GEMINI_STRUCTURE = ("responseMimeType", "responseSchema", "responseJsonSchema")


@dataclass(frozen=True, slots=True)
class Tool:
    """A function tool: its name and the JSON Schema of its arguments (`field`: where)."""

    name: str
    parameters: dict[str, Any] | bool
    field: str


NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def json_ask(request: Request) -> JsonAsk | Refusal | None:
    body = request.body
    if request.endpoint == CHAT and body.get("response_format") is not None:
        return _openai_format(body["response_format"], "response_format", nested=True)
    if request.endpoint == RESPONSES and body.get("text") is not None:
        text = body["text"]
        if not isinstance(text, dict):
            return Refusal("text", "must be an object")
        extra = sorted(set(text) - {"format"})
        if extra:
            return Refusal(f"text.{extra[0]}", "not honoured by this route")
        return None if text.get("format") is None else _openai_format(text["format"], "text.format", nested=False)
    if request.endpoint == MESSAGES and body.get("output_config") is not None:
        config = body["output_config"]
        if not isinstance(config, dict):
            return Refusal("output_config", "must be an object")
        extra = sorted(set(config) - {"format"})
        if extra:
            return Refusal(f"output_config.{extra[0]}", "not honoured by this route")
        fmt = config.get("format")
        if fmt is None:
            return None
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or "schema" not in fmt:
            return Refusal("output_config.format", "expected {type: json_schema, schema: {...}}")
        if not anthropic_structured(body.get("model")):  # as Anthropic answers such a model
            return Refusal("output_config.format", f"{body.get('model')!r} has no structured output (Claude 4.5 and later have it)")
        problem = schema_problem_cached(fmt["schema"])  # what Anthropic's structured outputs refuse
        if problem is not None:
            return Refusal("output_config.format.schema", problem)
        return JsonAsk("output_config.format.schema", fmt["schema"])
    if request.endpoint == GEMINI and isinstance(body.get("generationConfig"), dict):
        found = _gemini_ask(body["generationConfig"])
        if found is not None:
            return found
    if request.response_schema is not None:
        return JsonAsk("response_schema", request.response_schema)
    return None


def _gemini_ask(config: dict[str, Any]) -> JsonAsk | Refusal | None:
    mime = config.get("responseMimeType")
    if config.get("responseJsonSchema") is not None:
        field, schema = "generationConfig.responseJsonSchema", strip_ordering(config["responseJsonSchema"])
    elif config.get("responseSchema") is not None:
        field, schema = "generationConfig.responseSchema", gemini_json_schema(config["responseSchema"])
    else:
        field, schema = "generationConfig.responseMimeType", None
    if mime == "text/x.enum":
        enum = schema.get("enum") if isinstance(schema, dict) else None
        if not isinstance(enum, list) or not enum or not all(isinstance(v, str) for v in enum):
            return Refusal(field, "text/x.enum needs a schema with an enum of strings")
        return JsonAsk(field, {"type": "string", "enum": enum}, bare=True)
    if mime == "application/json":
        return JsonAsk(field, schema)
    if mime in (None, "text/plain") and schema is None:
        return None
    if mime in (None, "text/plain"):
        return Refusal(field, "a response schema needs responseMimeType application/json (or text/x.enum)")
    return Refusal("generationConfig.responseMimeType", f"{mime!r} is not honoured by this route (text/plain, application/json, text/x.enum)")


def gemini_json_schema(schema: Any) -> Any:
    """Gemini's OpenAPI-subset schema (`type: OBJECT`, `nullable: true`) as JSON Schema."""
    if isinstance(schema, list):
        return [gemini_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "propertyOrdering" or key == "nullable":
            continue
        if key == "type" and isinstance(value, str):
            out["type"] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {k: gemini_json_schema(v) for k, v in value.items()}
        elif key in ("items", "anyOf"):
            out[key] = gemini_json_schema(value)
        else:
            out[key] = value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def strip_ordering(schema: Any) -> Any:
    """A `responseJsonSchema` without Gemini's own `propertyOrdering` (not JSON Schema)."""
    if isinstance(schema, list):
        return [strip_ordering(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: strip_ordering(v) for k, v in schema.items() if k != "propertyOrdering"}


def _openai_format(fmt: Any, where: str, nested: bool) -> JsonAsk | Refusal | None:
    """chat's `response_format` ({type, json_schema: {name, schema, strict}}) or responses'
    `text.format` ({type, name, schema, strict}, flat)."""
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonAsk(where, None)
    if kind != "json_schema":
        return Refusal(f"{where}.type", f"format {kind!r} is not honoured by this route (text, json_object, json_schema)")
    spec = fmt.get("json_schema") if nested else fmt
    inner = f"{where}.json_schema" if nested else where
    if not isinstance(spec, dict):
        return Refusal(inner, "expected an object with the schema")
    if "schema" not in spec:
        return JsonAsk(inner, None)  # OpenAI: a json_schema format without a schema is any JSON object
    return JsonAsk(f"{inner}.schema", spec["schema"])


def tools(request: Request) -> list[Tool] | Refusal:
    given = request.body.get("tools")
    if given is None:
        return []
    if not isinstance(given, list):
        return Refusal("tools", "must be a list of tools")
    out = []
    for i, tool in enumerate(given):
        read = _TOOL_READERS.get(request.endpoint, _no_tools)(tool, f"tools[{i}]")
        if isinstance(read, Refusal):
            return read
        out.append(read)
    names = [t.name for t in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        return Refusal("tools", f"tool name {dupes[0]!r} is declared twice")
    return out


def _chat_tool(tool: Any, where: str) -> Tool | Refusal:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        return Refusal(f"{where}.type", f"tool type {kind!r} is not taken by this route (function tools only)")
    fn = tool.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        return Refusal(f"{where}.function.name", "a function tool needs a name")
    return Tool(fn["name"], fn.get("parameters", NO_PARAMETERS), f"{where}.function.parameters")


def _responses_tool(tool: Any, where: str) -> Tool | Refusal:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        return Refusal(f"{where}.type", f"tool type {kind!r} is not taken by this route (function tools only)")
    if not isinstance(tool.get("name"), str):
        return Refusal(f"{where}.name", "a function tool needs a name")
    parameters = tool.get("parameters")
    return Tool(tool["name"], NO_PARAMETERS if parameters is None else parameters, f"{where}.parameters")


def _messages_tool(tool: Any, where: str) -> Tool | Refusal:
    if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        return Refusal(f"{where}.type", f"tool type {kind!r} is not taken by this route (custom tools with an input_schema only)")
    if not isinstance(tool.get("name"), str):
        return Refusal(f"{where}.name", "a tool needs a name")
    if "input_schema" not in tool:
        return Refusal(f"{where}.input_schema", "a tool needs an input_schema")
    return Tool(tool["name"], tool["input_schema"], f"{where}.input_schema")


def _no_tools(tool: Any, where: str) -> Refusal:
    return Refusal("tools", "this endpoint takes no tools")


_TOOL_READERS = {CHAT: _chat_tool, RESPONSES: _responses_tool, MESSAGES: _messages_tool}


def required_call(request: Request, declared: list[Tool]) -> list[Tool] | Refusal:
    """The tools of which the body's `tool_choice` requires a call to one: [] when none is
    required (no tool_choice, auto, none), one tool when it names one."""
    choice = request.body.get("tool_choice")
    if choice is None:
        return []
    by_name = {t.name: t for t in declared}

    def named(name: Any, where: str) -> list[Tool] | Refusal:
        if name not in by_name:
            return Refusal(where, f"names {name!r}, which is not one of the tools")
        return [by_name[name]]

    if request.endpoint == MESSAGES:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind in ("auto", "none"):
            return []
        if kind == "any":
            return declared or Refusal("tool_choice", "requires a tool call, but no tools are given")
        if kind == "tool":
            return named(choice.get("name"), "tool_choice.name")
        return Refusal("tool_choice.type", f"{kind!r} is not one of auto, any, tool, none")
    if choice in ("none", "auto"):
        return []
    if choice == "required":
        return declared or Refusal("tool_choice", "requires a tool call, but no tools are given")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "function":
        if request.endpoint == CHAT:
            fn = choice.get("function")
            return named(fn.get("name") if isinstance(fn, dict) else None, "tool_choice.function.name")
        return named(choice.get("name"), "tool_choice.name")
    if kind == "allowed_tools":
        allowed = choice.get("allowed_tools") if request.endpoint == CHAT else choice
        where = "tool_choice.allowed_tools" if request.endpoint == CHAT else "tool_choice"
        if not isinstance(allowed, dict) or allowed.get("mode") not in ("auto", "required"):
            return Refusal(f"{where}.mode", "must be auto or required")
        if allowed["mode"] == "auto":
            return []
        picked = []
        for i, ref in enumerate(allowed.get("tools") or []):
            name = (ref.get("function") or {}).get("name") if request.endpoint == CHAT else ref.get("name")
            one = named(name, f"{where}.tools[{i}]")
            if isinstance(one, Refusal):
                return one
            picked += one
        return picked or Refusal(f"{where}.tools", "lists no tools")
    return Refusal("tool_choice", f"{choice!r} is not taken by this route (none, auto, required, a named function)")
