"""A row's own conversation (`template.messages_column`), checked against the endpoint's SDK type.

The cell is the conversation in the endpoint's native shape — content parts, the
`developer` role, assistant `tool_calls` and `tool` results on chat completions; `tool_use`
/ `tool_result`, image and document blocks and `cache_control` on Anthropic messages; input
items on responses — and is kept verbatim. What it may hold is read from the official
SDK's own type for the body's conversation key (`shapes`), so a role or part type the SDK
adds is taken the day it ships. A cell that does not fit is refused naming the row, the
message, the part and the fix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache
from typing import Any

from lowtide.core import shapes
from lowtide.core.endpoints import COMPLETIONS, body_type, conversation_key

PLAIN_ROLES = frozenset({"system", "user", "assistant"})
_PATH = re.compile(r"^\[(\d+)\](?:\.content\[(\d+)\])?")


@cache
def conversation_type(endpoint: str) -> Any:
    """The SDK's type for the conversation key of `endpoint`'s body (a list of messages)."""
    return shapes.fields(body_type(endpoint))[conversation_key(endpoint)][0]


def check(value: Any, endpoint: str, column: str, name: Callable[[], str]) -> list[dict[str, Any]]:
    """The cell as the conversation it is (JSON text parsed), or a ValueError naming the row
    (`name()`), the message and part, and the fix."""
    fix = f"the cell must hold a list of {endpoint} messages (docs/jobs.md \"Conversations\")"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f'{name()}: column "{column}" is not JSON ({err.msg}); {fix}') from None
    if not isinstance(value, list) or not value:
        raise ValueError(f'{name()}: column "{column}" must be a non-empty list of messages; {fix}')
    if _plain(value):  # text turns: the common case, and valid on every conversation endpoint
        return value
    if endpoint == COMPLETIONS:  # a prompt is text: only text turns can be joined into one
        raise ValueError(f'{name()}: column "{column}": {COMPLETIONS} takes a text prompt; give text turns (role system, user or assistant, text content)')
    found = shapes.problem(value, conversation_type(endpoint), "")
    if found is not None:
        path, _, reason = found.partition(": ")
        raise ValueError(f'{name()}: column "{column}" {_where(path, conversation_key(endpoint))}: {reason}; {fix}')
    return value


def _plain(value: list[Any]) -> bool:
    for m in value:
        if m.__class__ is not dict or len(m) != 2 or m.get("role") not in PLAIN_ROLES or m.get("content").__class__ is not str:
            return False
    return True


def _where(path: str, key: str) -> str:
    """`[2].content[0].type` as "message 3, part 1 (messages[2].content[0].type)"."""
    m = _PATH.match(path)
    if m is None:
        return f"({key}{path})"
    said = f"message {int(m.group(1)) + 1}" + (f", part {int(m.group(2)) + 1}" if m.group(2) is not None else "")
    return f"{said} ({key}{path})"
