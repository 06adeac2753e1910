"""Results as a partitioned dataset (`output.partition_by`): a folder, local or in an object
store, of Hive-style `col=value/` folders, each holding one `part-0.<ext>` file of the rows
with those values (the partition columns themselves live in the folder names only, as Hive,
Spark and pyarrow datasets read them).

The files are first written in full on local disk (a hidden folder beside the target, or
the system's temporary folder for an object store), so a failing export touches nothing
there; for an object store they are then uploaded under a hidden temporary prefix of the
target folder; then each file is moved into place, and every `part-N` file of an earlier
export (in `key=value/` folders) that this one did not write is removed; other files in the
folder are left alone. Running the same export again
writes the same files with the same content.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Any
from urllib.parse import quote

from lowtide.core.errors import LowtideError
from lowtide.core.locations import Location
from lowtide.engine.committed import store_errors, temp_name
from lowtide.engine.result_writers import EXTENSIONS, WRITERS, ArrowLayout, output_columns, tally

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # the folder of rows with no value, as Hive and pyarrow name it
MAX_PARTITIONS = 500  # each is an open file while writing
_PART = re.compile(r"part-\d+\.(csv|jsonl|parquet)")


def partition_value(value: Any) -> str:
    """A value as its folder name's `value` (percent-encoded where it is not a plain name)."""
    if value is None or value == "":
        return HIVE_NULL
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif hasattr(value, "isoformat"):
        text = value.isoformat()
    else:
        text = str(value)
    return quote(text, safe="")


def check_partition_columns(columns: Collection[str], known: list[str], where: str) -> None:
    """Refuse a partition column the results do not have, listing those they do."""
    for c in columns:
        if c not in known:
            raise LowtideError(f"output.partition_by: no column {c!r} in {where}; partition by one of: {', '.join(known)}")


class _Parts:
    """One open writer per partition, on local disk under `stage`."""

    def __init__(self, rows: Any, fmt: str, columns: list[str], stage: Path):
        self.rows, self.fmt, self.columns, self.stage = rows, fmt, columns, stage
        self.open: dict[tuple[str, ...], tuple[Any, Any]] = {}
        self.layout: ArrowLayout | None = None
        self.files: list[str] = []  # paths relative to the folder, in the order first written

    def write(self, chunk: list[dict[str, Any]]) -> None:
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for r in chunk:
            groups.setdefault(tuple(partition_value(r.get(c)) for c in self.columns), []).append(r)
        for key, part in groups.items():
            if key not in self.open:
                self._start(key)
            self.open[key][1].write(part)

    def _start(self, key: tuple[str, ...]) -> None:
        if len(self.open) >= MAX_PARTITIONS:
            raise LowtideError(f"output.partition_by {self.columns}: more than {MAX_PARTITIONS} partitions; "
                               "partition by columns with fewer values, or write one file")  # fmt: skip
        if self.layout is None and self.fmt == "parquet":  # one schema for every part (and one pass over the source)
            self.layout = ArrowLayout(self.rows, drop=self.columns)
        rel = "/".join(f"{c}={v}" for c, v in zip(self.columns, key, strict=True)) + f"/part-0{EXTENSIONS[self.fmt]}"
        path = self.stage / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        f = path.open("wb")
        self.open[key] = (f, WRITERS[self.fmt](f, self.rows, self.columns, self.layout))
        self.files.append(rel)

    def close(self) -> None:
        for f, writer in self.open.values():
            writer.close()
            f.close()
        self.open.clear()

    def abandon(self) -> None:
        for f, _ in self.open.values():
            f.close()
        self.open.clear()


def write_partitioned(rows: Any, folder: Location, fmt: str, columns: list[str]) -> tuple[int, dict[str, int], list[str]]:
    """Write `rows` as a partitioned dataset under `folder` (see the module): (rows written,
    rows per state, the files, relative to the folder)."""
    stage = Path(folder.path) / temp_name("partitions") if folder.local else Path(tempfile.mkdtemp(prefix="lowtide-partitions-"))
    parts = _Parts(rows, fmt, columns, stage)
    states: dict[str, int] = {}
    count = 0
    checked = False
    try:
        for chunk in tally(rows, states):
            if not checked:
                check_partition_columns(columns, output_columns(rows), "the results")
                checked = True
            parts.write(chunk)
            count += len(chunk)
        parts.close()
        if folder.local:
            _commit_local(stage, Path(folder.path), parts.files)
        else:
            _commit_remote(stage, folder, parts.files)
        _remove_stale(folder, set(parts.files))
    finally:
        parts.abandon()
        shutil.rmtree(stage, ignore_errors=True)
    return count, states, parts.files


def _commit_local(stage: Path, folder: Path, files: list[str]) -> None:
    for rel in files:
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage / rel, target)


def _commit_remote(stage: Path, folder: Location, files: list[str]) -> None:
    fs, base = folder.fs, folder.path.rstrip("/")
    tmp = f"{base}/{temp_name('partitions')}"
    try:
        with store_errors(folder.text):
            for rel in files:  # everything up before anything moves: a failed upload changes nothing
                fs.put_file(str(stage / rel), f"{tmp}/{rel}")
            for rel in files:
                fs.mv(f"{tmp}/{rel}", f"{base}/{rel}")
    finally:
        try:
            if fs.exists(tmp):
                fs.rm(tmp, recursive=True)
        except Exception:  # the error that brought us here is the one to report
            pass


def _remove_stale(folder: Location, written: set[str]) -> None:
    """Remove the part files of partitions (or formats, or partition columns) this export
    did not write: `part-N.<csv|jsonl|parquet>` files whose folders are all `key=value`."""
    fs, base = folder.fs, folder.path.rstrip("/")
    with store_errors(folder.text):
        fs.invalidate_cache()
        found = fs.find(base) if fs.exists(base) else []
        for path in found:
            rel = path[len(base) + 1 :] if path.startswith(base + "/") else None
            if rel is None or rel in written:
                continue
            *folders, name = rel.split("/")
            # a part file in Hive folders only: an earlier export's, of any partition columns
            if folders and _PART.fullmatch(name) and all("=" in f and not f.startswith((".", "_")) for f in folders):
                fs.rm(path)
                if folder.local:
                    _remove_empty(Path(path).parent, Path(base))


def _remove_empty(folder: Path, stop: Path) -> None:
    while folder != stop and folder.is_relative_to(stop) and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
