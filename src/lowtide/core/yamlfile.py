"""YAML files read into Pydantic models, with every problem named by file, line and key.

Job specs, gateway configs and price files all go through here, so a user sees the same
kind of message for each: `job.yaml line 12: unknown key `retries`; known keys here: …`.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from lowtide.core.errors import InputError, SpecError
from lowtide.core.fastjson import is_utf8

M = TypeVar("M", bound=BaseModel)
Lines = dict[tuple[str, ...], int]
# Values in a file once its aliases (`*name`) are expanded: every reader after the parser
# (key lines, validation, the store's JSON) walks them all, and nested aliases multiply
# (nine lines of them make a billion).
MAX_VALUES = 100_000


class _KeyTwice(Exception):
    pass


def read_text(path: Path, what: str, error: type[InputError] = SpecError) -> str:
    """A file's text; unreadable or non-UTF-8 files are refused with the place and the fix."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise error(f"{path}: cannot read the {what} ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise error(f"{path} line {line}: not UTF-8 text (byte 0x{err.object[err.start]:02x}); save the file as UTF-8") from None


def parse_mapping(
    text: str, where: str, not_a_mapping: str, error: type[InputError] = SpecError, *, empty_ok: bool = False
) -> tuple[dict[str, Any], Lines]:
    """The YAML mapping in `text` and the line of each key path. `not_a_mapping` is what to
    say when it is something else; a key given twice is refused (YAML would keep the last)."""
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise error(f"{where}{line}: not valid YAML ({getattr(err, 'problem', err)})") from None
    except RecursionError:  # the parser recurses per level of nesting
        raise error(f"{where}: nested too deep to read (hundreds of levels); flatten it") from None
    except ValueError as err:  # a value YAML reads as a date or time that has none (+25:00, month 13)
        raise error(_bad_time(node, where, err)) from None
    if _expanded(node, {}) > MAX_VALUES:
        raise error(
            f"{where}: more than {MAX_VALUES:,} values once its aliases (*name) are expanded; "
            "write the values out, or use fewer nested aliases"
        )
    if (found := _surrogate(data)) is not None:
        line = key_lines(node).get(found)
        at = f"{where} line {line}" if line else where
        raise error(f"{at}: `{'.'.join(found) or '(top level)'}` holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is not valid Unicode; remove it")
    if data is None and empty_ok:
        data = {}
    if not isinstance(data, dict):
        raise error(f"{where}: {not_a_mapping}")
    try:
        lines = key_lines(node)
    except _KeyTwice as err:
        raise error(f"{where} {err}") from None
    return data, lines


def _bad_time(node: yaml.Node | None, where: str, err: ValueError) -> str:
    """Which date-time YAML could not make, by line; the parser's own words otherwise."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, yaml.ScalarNode) and item.tag == "tag:yaml.org,2002:timestamp":
            try:
                yaml.SafeLoader("").construct_yaml_timestamp(item)
            except ValueError as why:
                said = "its UTC offset is 24 hours or more" if "offset" in str(why) else str(why)
                return (f"{where} line {item.start_mark.line + 1}: {item.value} is not a valid date or time ({said}); "
                        "write an ISO 8601 date-time with an offset between -23:59 and +23:59, e.g. 2026-12-05T10:00:00Z")  # fmt: skip
        elif isinstance(item, yaml.MappingNode):
            stack.extend(v for pair in item.value for v in pair)
        elif isinstance(item, yaml.SequenceNode):
            stack.extend(item.value)
    return f"{where}: not valid YAML ({err})"


def _expanded(node: yaml.Node | None, sizes: dict[int, int]) -> int:
    """How many values `node` holds with its aliases expanded; an alias is the same node
    object again, so each node is counted once (`sizes`) and the walk stays linear."""
    if node is None:
        return 0
    if (size := sizes.get(id(node))) is not None:
        return size
    size = 1
    if isinstance(node, yaml.MappingNode):
        size += sum(_expanded(k, sizes) + _expanded(v, sizes) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size += sum(_expanded(item, sizes) for item in node.value)
    sizes[id(node)] = size
    return size


def _surrogate(value: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The key path of the first text holding a lone surrogate (YAML reads "\\ud800" as one)."""
    if isinstance(value, str):
        return None if value.isascii() or is_utf8(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            found = _surrogate(key, (*path, str(key))) or _surrogate(item, (*path, str(key)))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if (found := _surrogate(item, (*path, str(i)))) is not None:
                return found
    return None


def key_lines(node: yaml.Node | None, prefix: tuple[str, ...] = ()) -> Lines:
    """Map each key path of a YAML document to its 1-based line number."""
    lines: Lines = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = (*prefix, str(key.value))
            if path in lines:
                raise _KeyTwice(
                    f"line {key.start_mark.line + 1}: key `{'.'.join(path)}` is given twice "
                    f"(first on line {lines[path]}); keep one"
                )
            lines[path] = key.start_mark.line + 1
            lines.update(key_lines(value, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = (*prefix, str(i))
            lines[path] = item.start_mark.line + 1
            lines.update(key_lines(item, path))
    return lines


def validate(
    model: type[M],
    data: dict[str, Any],
    where: str,
    what: str,
    lines: Lines | None = None,
    error: type[InputError] = SpecError,
    hint: Callable[[tuple[str, ...]], str] | None = None,
) -> M:
    """`model` built from `data`, or `error` listing every problem with its line and the keys
    allowed there. `hint(loc)` may add a fix to a wrong value's message."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        problems = [describe(e, model, where, lines or {}, hint) for e in err.errors()]
        raise error.from_problems(f"{where}: invalid {what}", problems) from None


def describe(
    error: Any, model: type[BaseModel], where: str, lines: Lines, hint: Callable[[tuple[str, ...]], str] | None = None
) -> str:
    loc = tuple(str(p) for p in error["loc"])
    field = ".".join(loc) or "(top level)"
    line = lines.get(loc) or lines.get(loc[:-1])
    at = f"{where} line {line}" if line else where
    if error["type"] == "extra_forbidden":
        return f"{at}: unknown key `{field}`; known keys here: {', '.join(known_keys(model, loc[:-1]))}"
    if error["type"] == "missing":
        return f"{at}: `{field}` is required"
    msg = error["msg"].removeprefix("Value error, ")
    return f"{at}: `{field}`: {msg}{hint(loc) if hint else ''}"


def known_keys(model: type[BaseModel], loc: tuple[str, ...]) -> list[str]:
    """The keys allowed at `loc`, a path of keys (and list indexes) into `model`."""
    kind: Any = model
    for part in loc:
        kind = _unwrap(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            field = kind.model_fields.get(part)
            if field is None:
                return []
            kind = field.annotation
        elif get_origin(kind) is dict:
            kind = get_args(kind)[1]  # `part` is an entry's name
        elif get_origin(kind) in (list, tuple) and part.isdigit():
            kind = get_args(kind)[0]
        else:
            return []
    kind = _unwrap(kind)
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return [k for k in kind.model_fields if k != "base_dir"]
    return []


def _unwrap(kind: Any) -> Any:
    """Optional[X] and unions: the member a key path can go into (a model first)."""
    if get_origin(kind) not in (Union, types.UnionType):
        return kind
    members = [a for a in get_args(kind) if a is not type(None)]
    for member in members:
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return next((m for m in members if get_origin(m) in (dict, list, tuple)), members[0] if members else kind)
