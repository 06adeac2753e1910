"""An eval's answers as one long table (`lowtide results EVAL --out`): every variant's
results joined to the source, one block of rows per variant, with two more columns:

- `variant`: the variant that answered the row;
- `correct`: the row's verdict under the eval's scoring (`compare` gives the same one), or
  empty where the row was not scored (failed, no expected value, not judged).

Each variant's rows are its member job's export (engine/export.py): same columns, same
types, the same streaming, so a long table of 1M rows is written a chunk at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lowtide.core.errors import LowtideError
from lowtide.core.evals import EvalSpec
from lowtide.core.spec import format_of
from lowtide.engine.compare import compare
from lowtide.engine.export import ExportReport, ResultRows, write_rows
from lowtide.store.db import Store

EVAL_COLUMNS = ("variant", "correct")


class EvalRows:
    """The member jobs' `ResultRows` one after another, each row tagged (see the module)."""

    def __init__(self, store: Store, ev: EvalSpec, full: bool = False):
        report = compare(store, ev, disagreements=0)
        run = {v.variant for v in report.variants if v.rows}
        self.members = [(m.variant, ResultRows(store, m.spec.name, full=full)) for m in ev.members if m.variant in run]
        if not self.members:
            raise LowtideError(f'eval "{ev.name}" has no answers yet: run it first (`lowtide run` its spec)')
        self.verdicts = report.verdicts
        first = self.members[0][1]
        self.source, self.spec, self.parsed_schemas = first.source, first.spec, first.parsed_schemas

    @property
    def source_columns(self) -> list[str] | None:
        return self.members[0][1].source_columns

    def result_columns(self, source_columns: list[str]) -> dict[str, str]:
        names = self.members[0][1].result_columns(source_columns)
        taken = set(source_columns) | set(names.values())
        return names | {n: (f"lowtide_{n}" if n in taken else n) for n in EVAL_COLUMNS}

    def chunks(self) -> Iterator[list[dict[str, Any]]]:
        for variant, rows in self.members:
            verdicts = self.verdicts.get(variant, {})
            for chunk in rows.chunks():
                names = self.result_columns(self.source_columns or [])
                for record in chunk:
                    record[names["variant"]] = variant
                    record[names["correct"]] = verdicts.get(record[names["custom_id"]])
                yield chunk


def export_eval_results(store: Store, ev: EvalSpec, out: str | Path, full: bool = False) -> ExportReport:
    """Write every variant's answers to `out` (CSV, JSONL or Parquet by extension; a local
    path or an object-store URL), whole or not at all, as a job's export is (export.py)."""
    return write_rows(EvalRows(store, ev, full=full), out, format_of(str(out).rstrip("/").rsplit("/", 1)[-1]))
