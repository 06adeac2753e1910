"""Source rows, streamed in chunks: a million-row file is never held in memory.

    source = source_of(spec)                 # a file, a folder, a glob, a URL, or a SQL table
    for chunk in source.chunks(): ...        # lists of SourceRow, at most CHUNK_ROWS each

Row numbers are 1-based data rows across the whole source (the CSV header is not a row); CSV
and JSONL rows also carry the file line they start on, which is what an editor shows, and
the file they come from where the source is many files. In CSV and JSONL every record of the
files read takes a number, one that cannot be read as a row or that a filter or watermark
leaves out too, so a row's number is its place in the files, whatever was skipped before it.

A source of many files (a folder, a glob) reads them in name order; `key=value` folders
(Hive partitions: `dt=2026-12-03/`) become columns, and `source.filter` and `since` leave the
files of partitions they rule out unopened. Parquet is core/parquet_source.py (row groups
pruned by their statistics too); CSV and JSONL are read by lowtide's own readers, here, which
name the row and line of every problem; SQL is core/sql_source.py.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote

import orjson

from lowtide.core import fastjson, source_types
from lowtide.core.errors import SourceError
from lowtide.core.locations import Location, location
from lowtide.core.spec import FORMATS, JobSpec, SourceSpec, format_of

CHUNK_ROWS = 5000
CHUNK_CHARS = 16 * 2**20  # ... and about this much text: 5,000 rows of 40 kB prompts would be 200 MB
INFER_ROWS = 500  # rows a pass that infers CSV types reads between checks that it may stop
MAX_STRUCTURE_PROBLEMS = 1000  # rows a structural problem is reported for before reading stops

# A cell may be a whole document: no limit below what any provider takes in one request
# (the csv module's default, 131,072 characters, refuses an ordinary long text).
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


@dataclass(slots=True)
class SourceRow:
    number: int  # 1-based data row
    line: int | None  # file line where the row starts (CSV, JSONL)
    values: dict[str, Any]
    file: str | None = None  # the file it comes from, where the source is many files

    def where(self, name: Path | str) -> str:
        line = f" (line {self.line})" if self.line is not None and self.line != self.number else ""
        return f"{self.file or Path(name).name} row {self.number}{line}"


@dataclass(frozen=True, slots=True)
class Watermark:
    """Rows past `value` in `column`: what a `since` load reads."""

    column: str
    value: Any

    def to_json(self) -> str:
        """The value with its kind, so a date read back is a date (schema.py `watermarks`)."""
        from datetime import date, datetime
        from decimal import Decimal

        v = self.value
        if isinstance(v, datetime):
            kind, text = "timestamp", v.isoformat()
        elif isinstance(v, date):
            kind, text = "date", v.isoformat()
        elif isinstance(v, Decimal):
            kind, text = "decimal", str(v)
        elif isinstance(v, bool | int | float | str):
            kind, text = type(v).__name__, v
        else:
            kind, text = "string", str(v)
        return json.dumps({"kind": kind, "value": text})

    @classmethod
    def from_json(cls, column: str, text: str) -> Watermark:
        from datetime import date, datetime
        from decimal import Decimal

        data = json.loads(text)
        kind, v = data["kind"], data["value"]
        value = {"timestamp": datetime.fromisoformat, "date": date.fromisoformat, "decimal": Decimal}.get(kind, lambda x: x)(v)
        return cls(column, value)

    def shown(self) -> str:
        v = self.value
        return v.isoformat() if hasattr(v, "isoformat") else str(v)


class Source:
    """Rows to load: `columns` is known up front except for JSONL; `label` names the
    source in messages, `name` its rows (`name row 12`)."""

    label: str
    name: str
    format: str
    columns: list[str] | None = None

    def __init__(self) -> None:
        # Rows that cannot be read as rows (a CSV record of the wrong width, a JSONL line that
        # is not a JSON object, a value not of its declared type): skipped and listed here,
        # then raised together at the end of `chunks()`, or left to the caller to report with
        # its own problems (`strict=False`).
        self.problems: list[str] = []
        self.types: dict[str, str] = {}  # declared kinds (source.types)
        self.filters: list[tuple[str, str, Any]] = []
        self.after: Watermark | None = None
        self.since: str | None = None  # the `since` column: its highest value read is noted
        self.highest: Any = None  # the highest `since` value read, once `chunks()` has run

    @property
    def path(self) -> str:  # the name older callers print
        return self.label

    def chunks(self, size: int = CHUNK_ROWS, strict: bool = True) -> Iterator[list[SourceRow]]:
        """Yield the rows in chunks of at most `size`. Rows with a structural problem are
        left out and collected in `problems`; `strict` raises them all at the end."""
        self.problems = []
        self.highest = None
        chunk: list[SourceRow] = []
        chars = 0
        for row in self._rows(size):
            if self.types and self._mistyped(row):
                continue
            if self.since is not None:
                self._note_highest(row)
            chunk.append(row)
            chars += _chars(row.values)
            if len(chunk) >= size or chars >= CHUNK_CHARS:
                yield chunk
                chunk, chars = [], 0
        if chunk:
            yield chunk
        if strict and self.problems:
            raise SourceError.from_problems(f"{self.label}: cannot be read as {self.format}", self.problems)

    def _rows(self, size: int) -> Iterator[SourceRow]:
        raise NotImplementedError

    def arrow_types(self, columns: list[str]) -> dict[str, Any]:
        """column -> Arrow type, for the columns whose type is known or agreed by all values
        (a pass over the source where the format has no types: core/source_types.py)."""
        inference = source_types.Inference([c for c in columns if c not in self.types], text=self.format == "csv")
        if inference.seen:
            # A pass of its own: what a pass in progress noted (problems, the highest value) stays.
            noted = self.problems, self.highest
            chunks = self.chunks(INFER_ROWS, strict=False)
            try:
                for chunk in chunks:
                    for row in chunk:
                        inference.add(row.values)
                    if inference.settled:  # every column is text already (CSV): no cell further on changes that
                        break
            finally:
                chunks.close()
                self.problems, self.highest = noted
        kinds = {**inference.kinds(), **self.types}
        return {c: source_types.arrow_type(k) for c, k in kinds.items()}

    def keys(self) -> list[str]:
        """The columns, or where they are not known up front (JSONL) every key of any row,
        in the order they first appear (a pass of its own, as `arrow_types`)."""
        if self.columns is not None:
            return list(self.columns)
        seen: dict[str, None] = {}
        noted = self.problems, self.highest
        try:
            for chunk in self.chunks(strict=False):
                for row in chunk:
                    if not seen.keys() >= row.values.keys():
                        seen.update(dict.fromkeys(row.values))
        finally:
            self.problems, self.highest = noted
        return list(seen)

    def highest_of(self, column: str) -> Any:
        """The highest value of `column` among the rows the filter keeps, past no watermark."""
        after, self.after = self.after, None
        highest = None
        try:
            for chunk in self.chunks(strict=False):
                for row in chunk:
                    v = row.values.get(column)
                    if v is not None and (highest is None or compare_values(v, highest) > 0):
                        highest = v
        finally:
            self.after = after
        return highest

    def _problem(self, message: str) -> None:
        self.problems.append(message)
        if len(self.problems) >= MAX_STRUCTURE_PROBLEMS:
            raise SourceError.from_problems(f"{self.label}: cannot be read as {self.format} (stopped reading)", self.problems)

    def _mistyped(self, row: SourceRow) -> bool:
        for column, kind in self.types.items():
            why = source_types.problem(row.values.get(column), kind)
            if why is not None:
                self._problem(f'{row.where(self.name)}: column "{column}" is {_shown(row.values.get(column))}, {why} '
                              f"(source.types.{column}: {kind}); fix the value, or the type")  # fmt: skip
                return True
        return False

    def _note_highest(self, row: SourceRow) -> None:
        value = row.values.get(self.since)
        if value is not None and (self.highest is None or compare_values(value, self.highest) > 0):
            self.highest = value

    def _check_columns(self, columns: list[str], where: str) -> list[str]:
        repeated = sorted(c for c, n in Counter(columns).items() if n > 1)
        if repeated:
            names = ", ".join(f'"{c}"' for c in repeated)
            # a row is read as a dict: of two columns with one name, the last would win silently
            raise SourceError(f"{self.name} {where} names {names} more than once; give each column its own name")
        return columns

    def _check_known(self) -> None:
        """Columns that filters, `since` and `types` name must exist, where columns are
        known before the rows."""
        if self.columns is None:
            return
        wanted = [(c, "source.filter") for c, _, _ in self.filters] + [(c, f"source.types.{c}") for c in self.types]
        if self.since is not None:
            wanted.append((self.since, "source.since.column"))
        for column, key in wanted:
            if column not in self.columns:
                raise SourceError(f'{self.label}: {key} names column "{column}", which it does not have; columns are: {", ".join(self.columns)}')


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def compare_values(a: Any, b: Any) -> int:
    """-1, 0 or 1. Two texts that both spell numbers (CSV cells) compare as numbers, so "10"
    is past "9"; values of different kinds (a number and a word) compare as text."""
    if a.__class__ is str and b.__class__ is str:
        na, nb = _number(a), _number(b)
        if na is not None and nb is not None:
            a, b = na, nb
    try:
        return (a > b) - (a < b)
    except TypeError:
        a, b = str(a), str(b)
        return (a > b) - (a < b)


def _number(text: str) -> int | float | None:
    text = text.strip()
    if text[:1].isalpha():  # a word ("t0001", an ISO date is not): float() takes only inf and nan, refused below
        return None
    if source_types.INT_TEXT.match(text):
        return int(text)
    try:
        number = float(text)
    except ValueError:
        return None
    return number if number == number and abs(number) != float("inf") else None


def holds(value: Any, op: str, wanted: Any) -> bool:
    """Whether a row's value passes a filter item, as pyarrow would decide it."""
    if value is None:
        return False
    if op in ("in", "not in"):
        inside = any(compare_values(value, w) == 0 for w in wanted)
        return inside if op == "in" else not inside
    c = compare_values(value, wanted)
    return {"=": c == 0, "==": c == 0, "!=": c != 0, "<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}[op]


def typed_like(value: Any, like: Any) -> Any:
    """`value` (from the spec or the store) as the kind of `like` (a row's value), so that
    "2026-12-03" compares with a date, and 7 with "7" in a CSV cell, as values, not text."""
    from datetime import date, datetime

    if like is None or value is None or value.__class__ is like.__class__:
        return value
    try:
        if isinstance(like, bool):
            return source_types.convert(value, "bool")
        if isinstance(like, int):
            return source_types.convert(value, "int")
        if isinstance(like, float):
            return source_types.convert(value, "float")
        if isinstance(like, datetime):
            return source_types.convert(value, "timestamp").replace(tzinfo=like.tzinfo) if like.tzinfo is None else source_types.convert(value, "timestamp")
        if isinstance(like, date):
            return source_types.convert(value, "date")
        if isinstance(like, str):
            return value.isoformat() if isinstance(value, date) else str(value)
    except (ValueError, TypeError):
        return value
    return value


class FileSource(Source):
    """CSV or JSONL: one file or many (a folder, a glob), local or by URL."""

    def __init__(self, loc: Location, fmt: str, files: list[str]):
        super().__init__()
        self.loc = loc
        self.files = files
        self.format = fmt
        self.label = loc.text
        self.name = loc.name_of(files[0]) if len(files) == 1 else loc.text
        self.partitions = {f: partitions_of(loc, f) for f in files}
        self.partition_columns = list(dict.fromkeys(k for parts in self.partitions.values() for k in parts))
        self.columns: list[str] | None = None  # a CSV's: read once the filter and watermark are known (_check_known)
        # (watermark, the highest `since` value of the rows the filter keeps, past the
        # watermark or not), noted by a pass under a watermark that read every file: a file
        # has no index, so those rows are read anyway, and a night with nothing new needs no
        # second pass to tell that the column did not go backwards (`highest_of`).
        self.highest_read: tuple[Watermark, Any] | None = None

    # kept for callers that still read one local file by its path
    @property
    def path(self) -> str:
        return self.label

    def _check_known(self) -> None:
        if self.format == "csv":
            self.columns = self._read_columns()
        super()._check_known()

    def _read_columns(self) -> list[str]:
        # The first kept file's header is the source's: the others are checked as each is
        # read (a load is one transaction: a file that disagrees stores nothing), so a source
        # of a thousand files costs one open up front, and partitions that the filter or the
        # watermark leave out none.
        kept = [f for f in self.files if self._kept(self.partitions[f])]
        self.header = self._header((kept or self.files)[0])
        columns = self.header + [c for c in self.partition_columns if c not in self.header]
        return columns

    def _header(self, f: str) -> list[str]:
        name = self.loc.name_of(f)
        try:
            with self._open(f) as text:
                reader = csv.reader(text, strict=True)
                try:
                    header = next(reader, None)
                except csv.Error as err:
                    raise SourceError(f"{name} line 1: the header row: {_csv_reason(err, reader.line_num)}") from None
        except UnicodeDecodeError:
            raise self._not_utf8(f) from None
        if header is None:
            raise SourceError(f"{self.loc.text if len(self.files) == 1 else name}: empty file; a CSV source needs a header row")
        if not header:  # a blank first line: the reader would take it for a header of no columns
            raise SourceError(f"{name} line 1: blank; a CSV source's first line is its header row (remove the blank lines above it)")
        return self._check_columns([h.strip() for h in header], "line 1: the header")

    def _open(self, f: str, newline: str | None = "") -> IO[str]:
        if self.loc.local:
            try:
                return open(f, newline=newline, encoding="utf-8-sig")  # noqa: SIM115 - closed by the caller's `with`
            except OSError as err:
                raise SourceError(f"{f}: cannot read ({_reason(err)})") from None
        return self.loc.open_text(f, newline=newline)

    def _not_utf8(self, f: str) -> SourceError:
        line, col = _first_bad_utf8(self.loc, f)
        return SourceError(f"{self.loc.name_of(f)} line {line}, column {col}: not UTF-8 text; save the file as UTF-8")

    def highest_of(self, column: str) -> Any:
        read = self.highest_read
        if read is not None and read[0].column == column:
            return read[1]
        return super().highest_of(column)

    def _rows(self, size: int) -> Iterator[SourceRow]:
        number = 0  # the last row's number: a record that is no row still takes one (the reader counts it)
        many = len(self.files) > 1
        after = self.after
        self.highest_read = None
        seen: list[Any] | None = [None] if after is not None else None  # the highest past the filters (a box)
        for f in self.files:
            reader = self._csv if self.format == "csv" else self._jsonl
            extra = self.partitions[f]
            if extra and (self.filters or after is not None) and not self._kept(extra):
                if not self._kept(extra, watermark=False):
                    continue  # a partition the filter leaves out: none of its rows is kept
                seen = None  # one the watermark leaves out is never opened: its rows are not seen
                continue
            name = self.loc.name_of(f)
            before = number  # the rows of the files read before this one
            try:
                for number, line, values in reader(f, name, before):  # `number`: the last row read, after the loop too
                    if values is None:  # not a row: reported by the reader
                        continue
                    if extra:
                        values = {**values, **{k: v for k, v in extra.items() if k not in values}}
                    if self.filters and not all(holds(values.get(c), op, typed_like(w, values.get(c))) for c, op, w in self.filters):
                        continue
                    if after is not None:
                        v = values.get(after.column)
                        if seen is not None and v is not None and (seen[0] is None or compare_values(v, seen[0]) > 0):
                            seen[0] = v
                        if v is None or compare_values(v, typed_like(after.value, v)) <= 0:
                            continue
                    yield SourceRow(number, line, values, name if many else None)
            except UnicodeDecodeError:
                raise self._not_utf8(f) from None
            except OSError as err:
                raise SourceError(f"{self.loc.text if not many else name}: cannot read ({_reason(err)})") from None
        if after is not None and seen is not None:
            self.highest_read = (after, seen[0])

    def _kept(self, partition: dict[str, str], watermark: bool = True) -> bool:
        """Whether a file's `key=value` folders pass the filters and the watermark that name
        them (a CSV column of the same name is the row's own value: those are left to the rows)."""
        own = set(getattr(self, "header", ()))
        items = list(self.filters) + ([(self.after.column, ">", self.after.value)] if watermark and self.after is not None else [])
        return all(holds(partition[c], op, typed_like(w, partition[c])) for c, op, w in items if c in partition and c not in own)

    def _csv(self, f: str, name: str, number: int) -> Iterator[tuple[int, int, dict[str, Any] | None]]:
        """(row number, line, values) of each record, counting on from `number` (the rows of
        the files before); a record that is no row is reported, and given None for values."""
        with self._open(f) as text:
            # strict: a quote opened and never closed is an error, not a value that swallows
            # every row after it (the lenient reader returns them as one cell, silently)
            reader = csv.reader(text, strict=True)
            try:
                header = [h.strip() for h in next(reader)]
            except StopIteration:
                raise SourceError(f"{name}: empty file; every CSV file of a source starts with the header row") from None
            if header != self.header:
                raise SourceError(f"{name}: its header ({', '.join(header)}) is not the first file's ({', '.join(self.header)}); "
                                  "give every file of a source the same columns")  # fmt: skip
            width = len(header)
            line = reader.line_num + 1
            try:
                for record in reader:
                    if not record:  # blank line
                        line = reader.line_num + 1
                        continue
                    number += 1
                    if len(record) != width:
                        self._problem(
                            f"{name} row {number} (line {line}): has {len(record)} fields, "
                            f"the header has {width}; quote values that contain commas"
                        )
                        yield number, line, None
                        line = reader.line_num + 1
                        continue
                    # not zip's `strict`: the width is checked above, and the keyword alone costs
                    # more than the dict (a call with keywords takes zip's slow way)
                    yield number, line, dict(zip(header, record))  # noqa: B905
                    line = reader.line_num + 1
            except csv.Error as err:  # the rows after it cannot be told apart: reading stops here
                self._problem(f"{name} row {number + 1} (line {line}): {_csv_reason(err, reader.line_num)}")

    def _jsonl(self, f: str, name: str, number: int) -> Iterator[tuple[int, int, dict[str, Any] | None]]:
        """As `_csv`: each line that is not blank is a row."""
        with self._open(f, newline=None) as text:
            for lineno, line in enumerate(text, start=1):
                if not line.strip():
                    continue
                number += 1
                try:
                    values = fastjson.loads(line)
                except json.JSONDecodeError as err:
                    self._problem(f"{name} line {lineno}: not valid JSON ({err.msg}, column {err.colno})")
                    yield number, lineno, None
                    continue
                if not isinstance(values, dict):
                    self._problem(f"{name} line {lineno}: each line must be a JSON object, got {type(values).__name__}")
                    yield number, lineno, None
                    continue
                yield number, lineno, values


def partitions_of(loc: Location, f: str) -> dict[str, str]:
    """The `key=value` folders between the location's base and the file."""
    base = loc.base.rstrip("/")
    rest = f[len(base) + 1 :] if base and f.startswith(base + "/") else f
    out = {}
    for part in rest.split("/")[:-1]:
        if "=" in part:
            key, _, value = part.partition("=")
            out[unquote(key)] = unquote(value)
    return out


def open_file(path: Path | str, fmt: str | None = None) -> Source:
    """One local file as a source (tests, evals' intermediate files)."""
    return source_at(SourceSpec(path=str(path), id_column="id", format=fmt))


def source_of(spec: JobSpec, after: Watermark | None = None) -> Source:
    """The source a spec names, ready to read (`after`: a `since` load's watermark)."""
    return source_at(spec.source, spec.base_dir, after)


def source_at(s: SourceSpec, base_dir: str | Path = ".", after: Watermark | None = None) -> Source:
    if s.url is not None:
        from lowtide.core.sql_source import SqlSource

        source: Source = SqlSource(s)
    else:
        loc = location(s.path, base_dir)
        files = loc.files()
        fmt = _format(loc, files, s.format)
        if s.format is None and not loc.one_file:
            files = [f for f in files if FORMATS.get(Path(f).suffix.lower()) == fmt]
        if fmt == "parquet":
            from lowtide.core.parquet_source import ParquetSource

            source = ParquetSource(loc, files)
        else:
            source = FileSource(loc, fmt, files)
    source.types = dict(s.types)
    source.filters = [tuple(f) for f in s.filter]
    source.after = after
    source.since = s.since.column if s.since is not None else None
    source._check_known()
    return source


def _format(loc: Location, files: list[str], declared: str | None) -> str:
    if loc.one_file:
        return format_of(files[0], declared)
    if declared:
        return declared
    found = sorted({FORMATS[Path(f).suffix.lower()] for f in files if Path(f).suffix.lower() in FORMATS})
    if len(found) != 1:
        what = "no file with a known extension" if not found else f"files of several formats ({', '.join(found)})"
        raise SourceError(f"{loc.text}: {what}; name one format with `source.format` (csv, jsonl or parquet), "
                          "or point source.path at one kind of file")  # fmt: skip
    return found[0]


def _first_bad_utf8(loc: Location, path: str) -> tuple[int, int]:
    """Line and column (1-based) of the first byte that is not UTF-8. The decoder reads in
    blocks, so the error it raises does not say where in the file the bad byte is."""
    with loc.open_bytes(path) as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return lineno, err.start + 1
    return 0, 0


def _csv_reason(err: csv.Error, line: int) -> str:
    if str(err) == "unexpected end of data":
        return (
            "a quoted value starts in this row and is never closed (the file ends inside it); "
            'close the quote, or write a quote inside a quoted value as two ("")'
        )
    return f'not valid CSV at line {line} ({err}); write a quote inside a quoted value as two (""), or quote the whole value'


def _reason(err: Exception) -> str:
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text at byte {err.start}; save the file as UTF-8"
    if isinstance(err, OSError):
        return err.strerror or str(err)
    return str(err)


def _chars(value: Any) -> int:
    """About how much text a row holds: its strings' lengths, nested ones included. Its JSON's
    length, written in C (a row's every value, once: 4x cheaper than walking it here), else
    (a value JSON cannot hold as it is) walked."""
    try:
        return len(orjson.dumps(value))
    except TypeError:
        return _walked(value)


def _walked(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_walked(v) for v in value.values())
    if isinstance(value, list):
        return sum(_walked(v) for v in value)
    return 8
