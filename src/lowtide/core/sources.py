"""Source rows, streamed in chunks: a million-row file is never held in memory.

Row numbers are 1-based data rows (the CSV header is not a row); CSV rows also carry the
file line they start on, which is what an editor shows.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowtide.core import fastjson
from lowtide.core.errors import SourceError
from lowtide.core.spec import format_of

CHUNK_ROWS = 5000
MAX_STRUCTURE_PROBLEMS = 1000  # rows a structural problem is reported for before reading stops

# A cell may be a whole document: no limit below what any provider takes in one request
# (the csv module's default, 131,072 characters, refuses an ordinary long text).
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


@dataclass(slots=True)
class SourceRow:
    number: int  # 1-based data row
    line: int | None  # file line where the row starts (CSV, JSONL)
    values: dict[str, Any]

    def where(self, path: Path | str) -> str:
        line = f" (line {self.line})" if self.line is not None and self.line != self.number else ""
        return f"{Path(path).name} row {self.number}{line}"


class Source:
    """A readable source file. `columns` is known up front for CSV and Parquet."""

    def __init__(self, path: Path | str, fmt: str | None = None):
        self.path = Path(path)
        # Rows that cannot be read as rows (a CSV record of the wrong width, a JSONL line that
        # is not a JSON object): skipped and listed here, then raised together at the end of
        # `chunks()`, or left to the caller to report with its own problems (`strict=False`).
        self.problems: list[str] = []
        if not self.path.exists():
            raise SourceError(f"{self.path}: no such file; check `source.path` (relative to the spec file)")
        if self.path.is_dir():
            raise SourceError(f"{self.path}: is a folder, not a file; point `source.path` at a file")
        self.format = format_of(self.path, fmt)
        self.columns: list[str] | None = self._read_columns()

    def _read_columns(self) -> list[str] | None:
        try:
            if self.format == "csv":
                with self.path.open(newline="", encoding="utf-8-sig") as f:
                    reader = csv.reader(f, strict=True)
                    try:
                        header = next(reader, None)
                    except csv.Error as err:
                        raise SourceError(f"{self.path.name} line 1: the header row: {_csv_reason(err, reader.line_num)}") from None
                if header is None:
                    raise SourceError(f"{self.path}: empty file; a CSV source needs a header row")
                if not header:  # a blank first line: the reader would take it for a header of no columns
                    raise SourceError(f"{self.path.name} line 1: blank; a CSV source's first line is its header row (remove the blank lines above it)")
                return self._distinct([h.strip() for h in header], "line 1: the header")
            if self.format == "parquet":
                import pyarrow.parquet as pq

                # a row is read as a dict: of two columns with one name, the last would win silently
                return self._distinct(list(pq.ParquetFile(self.path).schema_arrow.names), "schema")
        except UnicodeDecodeError:
            raise self._not_utf8() from None
        except OSError as err:
            raise SourceError(f"{self.path}: cannot read ({_reason(err)})") from None
        except SourceError:
            raise
        except Exception as err:  # pyarrow raises its own errors for corrupt files
            raise SourceError(f"{self.path}: cannot read as {self.format} ({err})") from None
        return None

    def _distinct(self, columns: list[str], where: str) -> list[str]:
        repeated = sorted(c for c, n in Counter(columns).items() if n > 1)
        if repeated:
            names = ", ".join(f'"{c}"' for c in repeated)
            raise SourceError(f"{self.path.name} {where} names {names} more than once; give each column its own name")
        return columns

    def _not_utf8(self) -> SourceError:
        line, col = _first_bad_utf8(self.path)
        return SourceError(f"{self.path.name} line {line}, column {col}: not UTF-8 text; save the file as UTF-8")

    def chunks(self, size: int = CHUNK_ROWS, strict: bool = True) -> Iterator[list[SourceRow]]:
        """Yield the rows in chunks of at most `size`. Rows with a structural problem are
        left out and collected in `problems`; `strict` raises them all at the end."""
        reader = {"csv": self._csv, "jsonl": self._jsonl, "parquet": self._parquet}[self.format]
        self.problems = []
        chunk: list[SourceRow] = []
        try:
            for row in reader():
                chunk.append(row)
                if len(chunk) >= size:
                    yield chunk
                    chunk = []
        except UnicodeDecodeError:
            raise self._not_utf8() from None
        except OSError as err:
            raise SourceError(f"{self.path}: cannot read ({_reason(err)})") from None
        if chunk:
            yield chunk
        if strict and self.problems:
            raise SourceError.from_problems(f"{self.path}: cannot be read as {self.format}", self.problems)

    def _problem(self, message: str) -> None:
        self.problems.append(message)
        if len(self.problems) >= MAX_STRUCTURE_PROBLEMS:
            raise SourceError.from_problems(f"{self.path}: cannot be read as {self.format} (stopped reading)", self.problems)

    def _csv(self) -> Iterator[SourceRow]:
        with self.path.open(newline="", encoding="utf-8-sig") as f:
            # strict: a quote opened and never closed is an error, not a value that swallows
            # every row after it (the lenient reader returns them as one cell, silently)
            reader = csv.reader(f, strict=True)
            header = [h.strip() for h in next(reader)]
            width = len(header)
            number = 0
            line = reader.line_num + 1
            try:
                for record in reader:
                    if not record:  # blank line
                        line = reader.line_num + 1
                        continue
                    number += 1
                    if len(record) != width:
                        self._problem(
                            f"{self.path.name} row {number} (line {line}): has {len(record)} fields, "
                            f"the header has {width}; quote values that contain commas"
                        )
                        line = reader.line_num + 1
                        continue
                    yield SourceRow(number, line, dict(zip(header, record, strict=True)))
                    line = reader.line_num + 1
            except csv.Error as err:  # the rows after it cannot be told apart: reading stops here
                self._problem(f"{self.path.name} row {number + 1} (line {line}): {_csv_reason(err, reader.line_num)}")

    def _jsonl(self) -> Iterator[SourceRow]:
        with self.path.open(encoding="utf-8-sig") as f:
            number = 0
            for lineno, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                number += 1
                try:
                    values = fastjson.loads(text)
                except json.JSONDecodeError as err:
                    self._problem(f"{self.path.name} line {lineno}: not valid JSON ({err.msg}, column {err.colno})")
                    continue
                if not isinstance(values, dict):
                    self._problem(f"{self.path.name} line {lineno}: each line must be a JSON object, got {type(values).__name__}")
                    continue
                yield SourceRow(number, lineno, values)

    def _parquet(self) -> Iterator[SourceRow]:
        import pyarrow.parquet as pq

        number = 0
        for batch in pq.ParquetFile(self.path).iter_batches(batch_size=CHUNK_ROWS):
            for values in batch.to_pylist():
                number += 1
                yield SourceRow(number, None, values)


def _first_bad_utf8(path: Path) -> tuple[int, int]:
    """Line and column (1-based) of the first byte that is not UTF-8. The decoder reads in
    blocks, so the error it raises does not say where in the file the bad byte is."""
    with path.open("rb") as f:
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
