"""Checking a model's answer against what the job asked for (choices or a JSON Schema)."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


class InvalidOutput(ValueError):
    """The answer does not satisfy the job's choices or schema; the message says why."""


def parse_output(text: str, schema: dict[str, Any] | None, choices: list[str] | None) -> Any:
    """Return the parsed answer (a choice, or the JSON value), or raise InvalidOutput."""
    if choices:
        answer = text.strip()
        for choice in choices:
            if answer == choice or answer.lower() == choice.lower():
                return choice
        raise InvalidOutput(f"answer {answer[:80]!r} is not one of the choices: {', '.join(choices)}")
    if schema is None:
        return None
    match = _FENCE.match(text)
    body = match.group(1) if match else text
    try:
        value = json.loads(body)
    except json.JSONDecodeError as err:
        raise InvalidOutput(f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    try:
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))
    except Exception as err:  # a schema the spec check let through (a stored job's, say): never crash ingest
        raise InvalidOutput(f"the schema could not be applied: {type(err).__name__}: {err}") from None
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "(root)"
        raise InvalidOutput(f"does not match the schema at {where}: {first.message}")
    return value


def repair_messages(bad_output: str, reason: str, schema: dict[str, Any] | None) -> list[dict[str, str]]:
    """The turn appended for the one retry of an invalid answer."""
    want = "Answer again with only JSON that matches this schema: " + json.dumps(schema) if schema else "Answer again with only one of the allowed answers."
    return [
        {"role": "assistant", "content": bad_output},
        {"role": "user", "content": f"That answer was invalid: {reason}. {want}"},
    ]
