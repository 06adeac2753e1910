"""The export's file writers (CSV, JSONL, Parquet) and the Arrow schema of a job's result
rows, which the Parquet writer and the SQL table sink (sql_sink.py) share.

A writer is given an open binary file and a result-rows object (export.py `ResultRows`, or
an eval's long table); it writes chunks as they come and, on `close`, flushes without
closing the file: whoever opened it decides whether it becomes the results (committed.py).
`drop` leaves columns out of the file: a partitioned dataset's columns live in its folder
names (partitions.py).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
from collections.abc import Collection, Iterator
from datetime import date, time
from itertools import repeat
from typing import IO, Any

import orjson

from lowtide.core import source_types
from lowtide.engine.answer_columns import answer_types, fit, schema_type

INT_COLUMNS = {"input_tokens", "output_tokens", "attempts"}
BOOL_COLUMNS = {"source_changed", "correct"}  # `correct`: an eval's long table (eval_export.py)


def output_columns(rows: Any, drop: Collection[str] = ()) -> list[str]:
    """The columns of the results, in order: the source's, then lowtide's."""
    cols = rows.source_columns or []
    return [c for c in [*cols, *rows.result_columns(cols).values()] if c not in drop]


class ArrowLayout:
    """The Arrow type of every result column and how each column's values are made of it:
    source columns of the source's own (or declared, or inferred) types; token counts int64;
    flags bool; parsed fields typed from the response schema (JSON text where no one type
    fits); the answer columns as answer_columns.py types them; the rest text. `only`: just
    those columns (a preflight asking about a few, without a pass over the whole source)."""

    def __init__(self, rows: Any, drop: Collection[str] = (), only: Collection[str] | None = None):
        import pyarrow as pa

        def wanted(c: str) -> bool:
            return c not in drop and (only is None or c in only)

        cols = rows.source_columns or []
        source = rows.source
        kinds = source.arrow_types([c for c in cols if wanted(c)])  # the source's own types, or inferred (core/source_types.py)
        fields = [pa.field(c, kinds.get(c) or pa.string()) for c in cols if wanted(c)]
        # CSV cells are text, and a declared type may be spelt as text: converted as written
        convert = {c: source_types.kind_of(kinds[c]) for c in kinds if c in source.types or source.format == "csv"}
        self.convert = {c: k for c, k in convert.items() if k not in (None, "string")}
        self.native = {c for c in kinds if c not in self.convert and source.types.get(c) != "string"}
        self.typed: dict[str, Any] = {}  # column -> the Arrow type its nested values are fitted to
        nested = answer_types() | {f: schema_type(s, rows.spec.response_schema) for f, s in rows.parsed_schemas.items()}
        for name, out in rows.result_columns(cols).items():
            if not wanted(out):
                continue
            kind = pa.int64() if name in INT_COLUMNS else pa.bool_() if name in BOOL_COLUMNS else nested.get(name) or pa.string()
            fields.append(pa.field(out, kind))
            if name in INT_COLUMNS or name in BOOL_COLUMNS:
                self.native.add(out)
            elif name in rows.parsed_schemas:  # typed from the schema, or JSON text where no type fits
                self.typed[out] = nested[name]
            elif name in nested:  # the answer columns: already of their types (core/answers.py)
                self.native.add(out)
        self.schema = pa.schema(fields)
        self.fields = [(f.name, f.type) for f in fields]  # read once: a field's name is a property

    def table(self, chunk: list[dict[str, Any]]):
        """`chunk`'s records as an Arrow table of the schema."""
        import pyarrow as pa

        columns = {}
        for name, kind in self.fields:
            values = list(map(dict.get, chunk, repeat(name)))  # (records are dicts; a loop in C)
            if name in self.typed:
                fitted = self.typed[name]
                values = [None if v is None else fit(v, fitted) for v in values]
            elif name in self.convert:
                to = self.convert[name]
                values = [source_types.convert(v, to) for v in values]
            elif name not in self.native and not _all_text(values):
                values = [v if v is None or v.__class__ is str else _text(v) for v in values]
            # A column with no value in the chunk (no tool calls anywhere, say) is made as
            # nulls: converting Nones to a nested type costs as much as real values.
            columns[name] = pa.nulls(len(values), kind) if _all_none(values) else values
        return pa.Table.from_pydict(columns, schema=self.schema)


def _all_none(values: list[Any]) -> bool:
    """Whether every value is None. A column whose first value is something is told at once:
    counting its Nones compares every value with None, which costs half the conversion."""
    return (not values or values[0] is None) and values.count(None) == len(values)


def _all_text(values: list[Any]) -> bool:
    """Whether every value is text or None (a CSV source's columns): told by a set of their
    classes, in C."""
    return set(map(type, values)) <= _TEXT_CLASSES


_TEXT_CLASSES = {str, type(None)}


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else str(value)


def _cell(value: Any) -> Any:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value


class CsvWriter:
    def __init__(self, f: IO[bytes], rows: Any, drop: Collection[str] = (), layout: ArrowLayout | None = None):
        self.f = io.TextIOWrapper(f, encoding="utf-8", newline="", write_through=True)
        self.rows, self.drop = rows, drop
        self.writer: csv.DictWriter | None = None

    def write(self, chunk: list[dict[str, Any]]) -> None:
        if self.writer is None:
            self.writer = csv.DictWriter(self.f, fieldnames=output_columns(self.rows, self.drop), extrasaction="ignore")
            self.writer.writeheader()
        self.writer.writerows({k: _cell(v) for k, v in r.items()} for r in chunk)

    def close(self) -> None:
        self.f.flush()
        self.f.detach()  # the file stays open: its opener commits it


class JsonlWriter:
    def __init__(self, f: IO[bytes], rows: Any, drop: Collection[str] = (), layout: ArrowLayout | None = None):
        self.f = f
        self.drop = set(drop)

    def write(self, chunk: list[dict[str, Any]]) -> None:
        drop = self.drop
        lines = (r if not drop else {k: v for k, v in r.items() if k not in drop} for r in chunk)
        self.f.write(b"".join(map(jsonl_line, lines)))

    def close(self) -> None:
        self.f.flush()


def jsonl_line(record: dict[str, Any]) -> bytes:
    """One record as a line of JSON: every line a JSON document, whatever a Parquet or SQL
    source holds. A float that is not a number (NaN, ±inf) is null, as JSON has none; times
    and dates are ISO 8601; bytes base64; a decimal its exact digits, as text."""
    try:
        return orjson.dumps(record, default=_json_value, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)
    except TypeError:  # what orjson refuses: an integer past 64 bits (a JSONL source's), a lone surrogate
        return (json.dumps(_finite(record), ensure_ascii=False, default=_json_value, separators=(",", ":")) + "\n").encode("utf-8", "surrogatepass")


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode()
    if isinstance(value, date | time):  # (orjson writes these itself; the json fallback does not)
        return value.isoformat()
    return str(value)  # Decimal: its digits, exactly


def _finite(value: Any) -> Any:
    if value.__class__ is float:
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class ParquetWriter:
    def __init__(self, f: IO[bytes], rows: Any, drop: Collection[str] = (), layout: ArrowLayout | None = None):
        self.f, self.rows, self.drop = f, rows, drop
        self.layout = layout
        self.writer = None

    def _open(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.layout is None:
            self.layout = ArrowLayout(self.rows, self.drop)
        self.writer = pq.ParquetWriter(self.f, self.layout.schema)
        self.pool = pa.default_memory_pool()

    def write(self, chunk: list[dict[str, Any]]) -> None:
        if self.writer is None:
            self._open()
        self.writer.write_table(self.layout.table(chunk))
        # Arrow's allocator keeps what a chunk freed for the next one, and more with each:
        # given back, a 1,000,000-row export to S3 peaks 14 MB lower (bench/sinks.py).
        self.pool.release_unused()

    def close(self) -> None:
        if self.writer is None:  # an empty source still gets a valid file
            self._open()
        self.writer.close()  # the footer; the file itself stays open


WRITERS = {"csv": CsvWriter, "jsonl": JsonlWriter, "parquet": ParquetWriter}
EXTENSIONS = {"csv": ".csv", "jsonl": ".jsonl", "parquet": ".parquet"}


def tally(rows: Any, states: dict[str, int]) -> Iterator[list[dict[str, Any]]]:
    """`rows`' chunks, each counted into `states` (rows per state) as it passes."""
    for chunk in rows.chunks():
        state_col = rows.result_columns(rows.source_columns or [])["state"]
        for r in chunk:
            states[r[state_col]] = states.get(r[state_col], 0) + 1
        yield chunk
