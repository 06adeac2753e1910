"""The types of source columns, for typed results (Parquet, SQL tables).

Parquet and SQL sources carry their own types. CSV and JSONL do not, so a column's type is
inferred from all its values, and `source.types` overrides it:

- CSV: a column whose non-empty cells are all integers is `int`, all numbers `float`, all
  `true`/`false` (any case) `bool`; anything else, and a column with no value, is `string`.
  A number written with a leading zero (`01234`: a zip code, a phone number) is text.
  An empty cell of a typed column is null. One word among a column's cells makes it text
  whatever the others are, so the pass that infers the types (sources.py `arrow_types`)
  stops once every column is text: a source of text columns costs its first rows.
- JSONL: JSON's own kinds: booleans, integers, numbers (integers among them), text; a column
  of mixed kinds or of objects and arrays is written as text (JSON for objects and arrays).
- `source.types: {column: kind}` with kind one of string, int, float, bool, date, timestamp.
  Every value of a declared column is checked as the rows are read: a value that is not of
  its kind refuses the load, naming the row, the column and the value. A timestamp without an
  offset is read as UTC.

Templates always see the values as read (CSV text stays text): types change the results
file, never a request.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, date, datetime
from typing import Any

KINDS = ("string", "int", "float", "bool", "date", "timestamp")
# Numbers as CSV cells write them, in ASCII digits. Python's int() and float() take more
# (Arabic-Indic and full-width digits, `1_000`) and float() overflows `1e400` to inf: text
# that a typed result would have rewritten as another value.
INT_TEXT = re.compile(r"^[+-]?[0-9]+$")
NUMBER_TEXT = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")
_NOT_FINITE = ("nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity")
_BOOL = {"true": True, "false": False}
INT64 = (-(2**63), 2**63)


def arrow_type(kind: str):
    import pyarrow as pa

    return {
        "string": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
        "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"),
    }[kind]  # fmt: skip


def kind_of(arrow) -> str | None:
    """The kind an Arrow type is written from (None: a type no kind makes)."""
    import pyarrow as pa

    for kind in KINDS:
        if arrow_type(kind) == arrow:
            return kind
    return "timestamp" if pa.types.is_timestamp(arrow) else None


def convert(value: Any, kind: str) -> Any:
    """`value` as `kind`'s Python value (None for an empty cell); ValueError says why not."""
    if value is None or (value.__class__ is str and value.strip() == "" and kind != "string"):
        return None
    if kind == "string":
        return value if value.__class__ is str else str(value)
    if kind == "int":
        if value.__class__ is bool:
            raise ValueError("not an integer")
        out = int(value) if value.__class__ is int or (value.__class__ is str and INT_TEXT.match(value.strip())) else _whole(value)
        if not INT64[0] <= out < INT64[1]:
            raise ValueError("past a 64-bit integer")
        return out
    if kind == "float":
        if value.__class__ is bool:
            raise ValueError("not a number")
        return _number(value)
    if kind == "bool":
        if value.__class__ is bool:
            return value
        if value.__class__ is str and value.strip().lower() in _BOOL:
            return _BOOL[value.strip().lower()]
        raise ValueError("not true or false")
    if kind == "date":
        if isinstance(value, datetime):
            return value.date()
        if isinstance(value, date):
            return value
        return date.fromisoformat(str(value).strip())
    if kind == "timestamp":
        if isinstance(value, datetime):
            moment = value
        elif isinstance(value, date):
            moment = datetime(value.year, value.month, value.day)
        else:
            moment = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    raise ValueError(f"unknown kind {kind!r}")


def _number(value: Any, not_one: str = "not a number") -> float:
    """`value` as a float: text only as a number written in ASCII (`NUMBER_TEXT`, finite), or
    a word for a value no digits write (`nan`, `inf`: a declared column may hold them).
    `not_one`: what the ValueError says of text that is no number."""
    if value.__class__ is not str:
        return float(value)
    text = value.strip()
    if text.lower() in _NOT_FINITE:
        return float(text)
    if not NUMBER_TEXT.match(text):
        raise ValueError(not_one)
    number = float(text)
    if math.isinf(number):
        raise ValueError("past a 64-bit float")
    return number


def _whole(value: Any) -> int:
    number = _number(value, "not an integer")
    if not number.is_integer():
        raise ValueError("not a whole number")
    return int(number)


_NOT = {"int": "not an integer", "float": "not a number", "bool": "not true or false", "date": "not a date (YYYY-MM-DD)",
        "timestamp": "not an ISO 8601 time (2026-12-03T09:00:00Z)"}  # fmt: skip
_OWN = ("past a 64-bit integer", "past a 64-bit float", "not a whole number", "not an integer", "not a number", "not true or false")


def problem(value: Any, kind: str) -> str | None:
    """Why `value` is not of `kind`, or None when it is."""
    try:
        convert(value, kind)
    except (ValueError, TypeError, OverflowError) as err:
        return str(err) if str(err) in _OWN else _NOT.get(kind, f"not a {kind}")
    return None


# The kinds a CSV column's cells may have seen and still agree on one (int and float: float).
_AGREEING = ({"int"}, {"float"}, {"int", "float"}, {"bool"})


class Inference:
    """The kind of each column, from the values seen so far (`add`), then `kinds()`.
    A CSV column is `string` as soon as its cells can no longer agree on another kind (a
    word among numbers): `settled` says when every column is, so a pass can stop there."""

    def __init__(self, columns: list[str], text: bool):
        self.text = text  # CSV: every value is text, read for what it spells
        self.seen: dict[str, set[str]] = {c: set() for c in columns}
        self.open = list(columns)  # CSV: the columns whose kind the next cells may still change

    @property
    def settled(self) -> bool:
        return self.text and not self.open

    def add(self, values: dict[str, Any]) -> None:
        if not self.text:
            for column, kinds in self.seen.items():
                value = values.get(column)
                if value is not None:
                    kinds.add(self._value_kind(value))
            return
        changed = False
        for column in self.open:
            value = values.get(column)
            if value is None:
                continue
            kind = self._text_kind(value)
            if kind is not None and kind not in (kinds := self.seen[column]):
                kinds.add(kind)
                changed = True
        if changed:
            self.open = [c for c in self.open if not self.seen[c] or self.seen[c] in _AGREEING]

    @staticmethod
    def _text_kind(value: str) -> str | None:
        v = value.strip()
        if v == "":
            return None
        if INT_TEXT.match(v):
            if len(v.lstrip("+-")) > 1 and v.lstrip("+-").startswith("0"):
                return "string"  # a zip code or a phone number: its leading zeros are its value
            return "int" if INT64[0] <= int(v) < INT64[1] else "string"
        if v.lower() in _BOOL:
            return "bool"
        return "float" if NUMBER_TEXT.match(v) and not math.isinf(float(v)) else "string"

    @staticmethod
    def _value_kind(value: Any) -> str:
        cls = value.__class__
        if cls is bool:
            return "bool"
        if cls is int:
            return "int" if INT64[0] <= value < INT64[1] else "string"
        if cls is float:
            return "float"
        if cls is str:
            return "string"
        if cls is datetime:
            return "timestamp"
        if cls is date:
            return "date"
        return "json"

    def kinds(self) -> dict[str, str]:
        """column -> kind, for the columns whose values agree on one (nulls aside)."""
        out = {}
        for column, kinds in self.seen.items():
            kinds = kinds - {None}
            if self.text and kinds and kinds not in _AGREEING:  # cells of several kinds, a word among them: text
                out[column] = "string"
            elif kinds == {"int", "float"}:
                out[column] = "float"
            elif len(kinds) == 1 and "json" not in kinds:
                out[column] = next(iter(kinds))
        return out
