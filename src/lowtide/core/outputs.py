"""Checking a model's answer against what the job asked for (choices or a JSON Schema), or,
for an answer that is a tool call, against the called tool's own parameters schema."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from lowtide.core.answers import read_answer
from lowtide.core.native_schema import SHORT_ANSWER, unwrap_choice

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


class InvalidOutput(ValueError):
    """The answer does not satisfy the job's choices or schema; the message says why."""


def parse_output(text: str, schema: dict[str, Any] | None, choices: Sequence[str] | None) -> Any:
    """Return the parsed answer (a choice, or the JSON value), or raise InvalidOutput.
    A choice asked as JSON (`{"choice": ...}`, core/native_schema.py) is read unwrapped."""
    if choices:
        if text.__class__ is str and len(text) <= SHORT_ANSWER:
            return _short_choice(text, tuple(choices))
        return _choice(text, choices)
    if schema is None:
        return None
    match = _FENCE.match(text)
    body = match.group(1) if match else text
    try:
        value = json.loads(body)
    except json.JSONDecodeError as err:
        raise InvalidOutput(f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    _validate(value, schema, "the schema")
    return value


@lru_cache(maxsize=1024)  # a job's valid answers are its few choices: each compared with them once
def _short_choice(text: str, choices: tuple[str, ...]) -> str:
    return _choice(text, choices)  # (an invalid answer raises: not remembered, checked again)


def _choice(text: str, choices: Sequence[str]) -> str:
    answer = (unwrap_choice(text) or "").strip()
    for choice in choices:
        if answer == choice or answer.lower() == choice.lower():
            return choice
    raise InvalidOutput(f"answer {answer[:80]!r} is not one of the choices: {', '.join(choices)}")


def _validate(value: Any, schema: dict[str, Any], what: str) -> None:
    import jsonschema  # here: a job of choices or free text never pays its import (~50 ms)

    try:
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))
    except Exception as err:  # a schema the spec check let through (a stored job's, say): never crash ingest
        raise InvalidOutput(f"{what} could not be applied: {type(err).__name__}: {err}") from None
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "(root)"
        raise InvalidOutput(f"does not match {what} at {where}: {first.message}")


# The tools a request declared: name -> parameters schema (None: nothing to check, as for a
# custom tool's free text or a function declared without parameters).
ToolSchemas = dict[str, dict[str, Any] | None]


def tool_schemas(endpoint: str, body: dict[str, Any]) -> ToolSchemas:
    """The tools a request body declares, in its endpoint's shape (chat: `function.parameters`;
    responses: `parameters`; Anthropic messages: `input_schema`)."""
    out: ToolSchemas = {}
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if endpoint == "/v1/chat/completions":
            fn = tool.get(tool.get("type") or "function")
            fn = fn if isinstance(fn, dict) else {}
            name, schema = fn.get("name"), fn.get("parameters")
        elif endpoint == "/v1/messages":
            name, schema = tool.get("name"), tool.get("input_schema")
        else:
            name, schema = tool.get("name"), tool.get("parameters")
        if isinstance(name, str):
            out[name] = schema if isinstance(schema, dict) else None
    return out


def check_tool_calls(calls: list[dict[str, Any]], tools: ToolSchemas) -> None:
    """Each call names one of the request's tools, and a function call's arguments are JSON
    valid against that tool's parameters; else InvalidOutput saying which call and why."""
    for i, call in enumerate(calls):
        name = call.get("name")
        where = f"tool call {i + 1} ({name})"
        if name not in tools:
            raise InvalidOutput(f"{where} names no tool of the request (its tools: {', '.join(sorted(tools)) or 'none'})")
        if call.get("type") != "function":
            continue  # a custom tool takes free text
        try:
            args = json.loads(call.get("arguments") or "{}")
        except json.JSONDecodeError as err:
            raise InvalidOutput(f"{where}: arguments are not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
        if tools[name] is not None:
            try:
                _validate(args, tools[name], "its parameters")
            except InvalidOutput as err:
                raise InvalidOutput(f"{where}: {err}") from None


def repair_messages(bad_output: str, reason: str, schema: dict[str, Any] | None) -> list[dict[str, str]]:
    """The turn appended for the one retry of an invalid answer."""
    want = "Answer again with only JSON that matches this schema: " + json.dumps(schema) if schema else "Answer again with only one of the allowed answers."
    return [
        {"role": "assistant", "content": bad_output},
        {"role": "user", "content": f"That answer was invalid: {reason}. {want}"},
    ]


def tool_repair(endpoint: str, response: dict[str, Any], calls: list[dict[str, Any]], reason: str) -> list[dict[str, Any]]:
    """The turns appended for the one retry of an invalid tool call, in the endpoint's shape:
    the calls as the model made them, then each call's result saying what was wrong."""
    result = f"That call was invalid: {reason}. Call the tool again with arguments that match its parameters."
    if endpoint == "/v1/messages":  # the whole turn (a thinking block must go back with its tool use)
        blocks = [_given(b) for b in response.get("content") or [] if isinstance(b, dict)]
        results = [{"type": "tool_result", "tool_use_id": c["id"], "content": result, "is_error": True} for c in calls]
        return [{"role": "assistant", "content": blocks}, {"role": "user", "content": results}]
    if endpoint == "/v1/responses":
        made = [_given(i) for i in response.get("output") or [] if isinstance(i, dict) and i.get("type") in ("function_call", "custom_tool_call")]
        kind = {"function": "function_call_output", "custom": "custom_tool_call_output"}
        return made + [{"type": kind[c["type"]], "call_id": c["id"], "output": result} for c in calls]
    made = [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} if c["type"] == "function"
        else {"id": c["id"], "type": "custom", "custom": {"name": c["name"], "input": c["arguments"]}}
        for c in calls
    ]  # fmt: skip
    said = read_answer(response).first.text  # any text beside the calls goes back with them
    return [{"role": "assistant", "content": said, "tool_calls": made}] + [{"role": "tool", "tool_call_id": c["id"], "content": result} for c in calls]


def _given(item: dict[str, Any]) -> dict[str, Any]:
    """An output item or block sent back as input: the provider's nulls mean "not set", and
    input types take them absent, not null."""
    return {k: v for k, v in item.items() if v is not None}
