"""Ids repeated in a source, and an increment's versions of one row (docs/data.md, "Nightly
increments").

A source's ids are unique, except in an increment source (`source.since`): there a ticket may
come one night and again, edited, on a later night. Its rows are versions of one request, and
the newest (highest `since` value) stands: the one a load renders, and the one the results
join the request to. Rows of one id that no `since` value tells apart are duplicates.

    ids = IdWatch()                                     # 8 bytes a row: each id's hash
    ...ids.add(custom_id) for every row...
    if ids.has_repeats():
        groups = repeated_rows(source, id_column, ids, variant)   # a second pass, only then
        newest = Newest.of(groups, since_column)
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from functools import cmp_to_key
from typing import Any

from lowtide.core.fastjson import is_utf8
from lowtide.core.ids import custom_id_for, key_of
from lowtide.core.sources import Source, SourceRow, compare_values


class IdWatch:
    """Spots repeated custom_ids in a file of any size in 8 bytes a row: each id's hash goes
    into a flat array; repeats of a hash are checked against the real ids afterwards."""

    def __init__(self) -> None:
        self.hashes = array("q")
        self.repeated: set[int] = set()

    def add(self, custom_id: str) -> None:
        self.hashes.append(hash(custom_id))

    def has_repeats(self) -> bool:
        import numpy as np

        # Sorted in place, in the array's own buffer: a repeat lands beside its twin, and the
        # check costs a byte a row (a hash table of counts held ~64 MB per million rows).
        hashes = np.frombuffer(self.hashes, dtype=np.int64)
        if len(hashes) < 2:
            return False
        hashes.sort()
        same = hashes[1:] == hashes[:-1]
        if not same.any():
            return False
        self.repeated = set(hashes[1:][same].tolist())
        return True


def row_id(values: dict[str, Any], id_column: str, variant: str | None) -> str | None:
    """The custom_id of a row, or None where its id is empty or not valid Unicode (the
    loader refuses such a row by name)."""
    key = values.get(id_column)
    if key is None or not (key := str(key).strip()):
        return None
    return custom_id_for(key_of(key), variant) if key.isascii() or is_utf8(key) else None


def repeated_rows(source: Source, id_column: str, ids: IdWatch, variant: str | None) -> dict[str, list[SourceRow]]:
    """custom_id -> its rows, for each id in more than one row: a pass over the source, only
    when `ids` has repeats."""
    groups: dict[str, list[SourceRow]] = {}
    for chunk in source.chunks(strict=False):  # its structural problems are reported by the caller's pass
        for row in chunk:
            cid = row_id(row.values, id_column, variant)
            if cid is not None and hash(cid) in ids.repeated:
                groups.setdefault(cid, []).append(row)
    return {cid: rows for cid, rows in groups.items() if len(rows) > 1}


@dataclass(slots=True)
class Newest:
    """The newest `since` value of each id in several rows of an increment source, and the
    ids whose newest value more than one row shares (duplicates, with those rows)."""

    column: str
    top: dict[str, Any]
    ties: dict[str, list[SourceRow]]

    @classmethod
    def of(cls, groups: dict[str, list[SourceRow]], column: str) -> Newest:
        top, ties = {}, {}
        for cid, rows in groups.items():
            values = [r.values.get(column) for r in rows]
            best = max((v for v in values if v is not None), key=cmp_to_key(compare_values), default=None)
            top[cid] = best
            newest = [r for r, v in zip(rows, values, strict=True) if _same(v, best)]
            if len(newest) > 1:
                ties[cid] = newest
        return cls(column, top, ties)

    def older(self, cid: str | None, values: dict[str, Any]) -> bool:
        """Whether a row of `cid` with these values is an older version of a newer row."""
        if cid not in self.top or (best := self.top[cid]) is None:
            return False
        v = values.get(self.column)
        return v is None or compare_values(v, best) < 0


def _same(value: Any, best: Any) -> bool:
    if value is None or best is None:
        return value is best
    return compare_values(value, best) == 0
