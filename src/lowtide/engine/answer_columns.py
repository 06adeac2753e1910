"""The export's columns read from the provider's stored answer, and the Parquet types of
every nested column (these and the parsed schema fields).

Values are plain Python (dicts, lists, ints, floats, text): JSONL writes them as they are,
CSV as JSON text, Parquet as the struct and list types below. A parsed field's Parquet type
comes from the job's `response_schema`, so it is the same in every row group: an object with
`properties` is a struct of them, an array a list of its `items`, `string`/`integer`/
`number`/`boolean` (or an `enum`/`const` of one kind) those types; `$ref` to `#/$defs/…`
is followed. Anything else (`anyOf`, an object without properties, a type list, a
recursive `$ref`) has no one Arrow type and is written as JSON text. A struct holds the
declared properties; keys an answer adds beyond them are in its `output` text.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from lowtide.core import fastjson
from lowtide.core.answers import Answer, read_answer

ANSWER_COLUMNS = ("finish_reason", "tool_calls", "refusal", "reasoning", "logprobs", "choices")
_EMPTY = dict.fromkeys(ANSWER_COLUMNS)


def answer_values(response: Any) -> dict[str, Any]:
    """The answer columns of one stored response (a dict, or None where there is none).
    The top-level ones are the first choice's; `choices` lists every choice, and is filled
    only where the provider returned more than one (n > 1)."""
    if response is None:
        return _EMPTY
    plain = _plain_chat(response)
    if plain is not None:
        return plain
    answer: Answer = read_answer(response)
    first = answer.first
    return {
        "finish_reason": first.finish_reason,
        "tool_calls": first.tool_calls,
        "refusal": first.refusal,
        "reasoning": first.reasoning,
        "logprobs": first.logprobs,
        "choices": [c.as_dict() for c in answer.choices] if len(answer.choices) > 1 else None,
    }


def _plain_chat(response: dict[str, Any]) -> dict[str, Any] | None:
    """The columns of the most common answer, one chat choice of text alone, in a few
    lookups (a 100,000-row export reads one per row); None for any other answer."""
    finish = _plain_finish(response)
    return None if finish is _NOT_PLAIN else {**_EMPTY, "finish_reason": finish}


_NOT_PLAIN = object()


def _plain_finish(response: Any) -> Any:
    """The finish_reason (text or None) of one chat choice of text alone; _NOT_PLAIN for any
    other answer."""
    try:
        (first,) = response["choices"]
        message = first["message"]
        if (
            message.get("tool_calls") or first.get("logprobs") or message.get("refusal")
            or message.get("reasoning_content") or message.get("reasoning")
        ):  # fmt: skip
            return _NOT_PLAIN
    except (KeyError, TypeError, ValueError, AttributeError):  # not one chat choice
        return _NOT_PLAIN
    finish = first.get("finish_reason")
    return finish if finish is None or finish.__class__ is str else _NOT_PLAIN


def plain_record(response: Any) -> str | None:
    """What ingest stores beside a response (`requests.plain_answer`) where it is a plain
    answer: its finish_reason as JSON, all `plain_values` needs to give the same columns as
    `answer_values(response)`. None for any other answer (or none), read whole by the export."""
    finish = _NOT_PLAIN if response is None else _plain_finish(response)
    return None if finish is _NOT_PLAIN else _as_json(finish)


def plain_chat_record(finish: str | None) -> str:
    """`plain_record` of one chat choice of text alone whose finish_reason is `finish` (an
    answer whose JSON text the route wrote itself: core/types.py `WrittenOutcome`)."""
    return _as_json(finish)


def kept_record(response: Any) -> str:
    """What `prune --keep-results` stores in `requests.plain_answer` as it drops a response the
    export cannot read from a plain record (tool calls, a refusal, reasoning, logprobs, n > 1, or
    an answer stored before m017): `answer_values(response)` as one JSON object, the columns
    that are not null alone. A plain record is JSON text of a string or null, never an object,
    so `plain_values` tells the two apart by the first character."""
    return fastjson.dumps({k: v for k, v in answer_values(response).items() if v is not None})


def plain_values(record: str) -> dict[str, Any]:
    """The answer columns from a stored `plain_answer`: a plain answer's `plain_record` (shared:
    not to be changed), or a `kept_record` (a JSON object: a dict of its own)."""
    if record[:1] == "{":
        return {**_EMPTY, **fastjson.loads(record)}
    return _plain_values(record)


@lru_cache(maxsize=256)  # a job's answers share a handful of finish reasons
def _plain_values(record: str) -> dict[str, Any]:
    return {**_EMPTY, "finish_reason": fastjson.loads(record)}


@lru_cache(maxsize=256)
def _as_json(finish: str | None) -> str:
    return fastjson.dumps(finish)


def answer_types() -> dict[str, Any]:
    """column -> its Arrow type."""
    import pyarrow as pa

    text = pa.string()
    call = pa.struct([("id", text), ("type", text), ("name", text), ("arguments", text)])
    top = pa.struct([("token", text), ("logprob", pa.float64()), ("bytes", pa.list_(pa.int64()))])
    logprob = pa.struct([*((top.field(i).name, top.field(i).type) for i in range(3)), ("top_logprobs", pa.list_(top))])
    choice = pa.struct([
        ("index", pa.int64()), ("text", text), ("tool_calls", pa.list_(call)), ("refusal", text),
        ("finish_reason", text), ("logprobs", pa.list_(logprob)), ("reasoning", text),
    ])  # fmt: skip
    return {
        "finish_reason": text, "tool_calls": pa.list_(call), "refusal": text, "reasoning": text,
        "logprobs": pa.list_(logprob), "choices": pa.list_(choice),
    }  # fmt: skip


def schema_type(schema: Any, root: dict[str, Any] | None = None, seen: frozenset[str] = frozenset()) -> Any:
    """The Arrow type of values valid against `schema`, or None where no one type fits
    (they are then written as JSON text)."""
    import pyarrow as pa

    if not isinstance(schema, dict):
        return None
    root = schema if root is None else root
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = _ref(root, ref)
        return None if target is None or ref in seen else schema_type(target, root, seen | {ref})
    kind = schema.get("type")
    if isinstance(kind, list):  # a union of types ("string" or "null"): one type besides null, else JSON text
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 and isinstance(kinds[0], str) else None
        if kind is None:
            return None
    branches = schema.get("anyOf", schema.get("oneOf"))
    if kind is None and isinstance(branches, list) and branches:
        # one Arrow type for every branch but the null one (an optional field), else JSON text
        types = [schema_type(b, root, seen) for b in branches if not (isinstance(b, dict) and b.get("type") == "null")]
        return types[0] if types and types[0] is not None and all(t == types[0] for t in types) else None
    if kind is None:
        values = schema["enum"] if isinstance(schema.get("enum"), list) else [schema["const"]] if "const" in schema else None
        kinds = {_json_kind(v) for v in values or [None]}
        kind = kinds.pop() if len(kinds) == 1 else None
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            return None
        fields = [(name, schema_type(sub, root, seen)) for name, sub in props.items()]
        return pa.struct([(name, t if t is not None else pa.string()) for name, t in fields])
    if kind == "array":
        items = schema_type(schema.get("items"), root, seen)
        return None if items is None else pa.list_(items)
    return {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}.get(kind) if isinstance(kind, str) else None


def _ref(root: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _json_kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {str: "string", float: "number"}.get(type(value))


def fit(value: Any, kind: Any) -> Any:
    """`value` in the shape `kind` (an Arrow type, or None for JSON text) takes. Answers were
    checked against the schema the type comes from, so this only settles JSON's looseness
    (1.0 for an integer) and writes what has no typed place (a field nested under a JSON-text
    type) as JSON text; a value that still does not fit is left out (None), not guessed."""
    import pyarrow as pa

    if value is None:
        return None
    if kind is None or pa.types.is_string(kind):
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if pa.types.is_struct(kind):
        if not isinstance(value, dict):
            return None
        return {kind.field(i).name: fit(value.get(kind.field(i).name), kind.field(i).type) for i in range(kind.num_fields)}
    if pa.types.is_list(kind):
        return [fit(v, kind.value_type) for v in value] if isinstance(value, list) else None
    if pa.types.is_boolean(kind):
        return value if isinstance(value, bool) else None
    if pa.types.is_integer(kind):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63 else None
    if pa.types.is_floating(kind):
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    return None
