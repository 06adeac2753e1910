"""A stage that depends on other jobs' results: its source is written from their answers.

A dependent stage is an ordinary job whose source file is made here from the upstream jobs'
stored results (by default the succeeded ones): each row is the upstream row's source values
plus `row_id` (the upstream custom_id, unique across the upstream jobs), `key` (the business
key), `output`, `answer` (the parsed JSON answer, if any) and whatever columns the caller
adds per upstream job (an eval adds variant, model, prompt and expected). Loading that job is
the usual load: rows already stored are left alone, so writing the file again after more
upstream answers arrived adds only those (the moderation pattern: a cheap first pass, then a
deeper pass over what it flagged, with `keep` choosing the rows).

A stored stage request is for the upstream answer it was rendered from: `stage_fingerprints`
says what each row renders as now, so a request (and its answer) rendered from an earlier
upstream answer is told apart, never paired with the new one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import select

from lowtide.core import fastjson
from lowtide.core.errors import SourceError
from lowtide.core.ids import key_of
from lowtide.core.sources import SourceRow, source_of
from lowtide.core.spec import JobSpec
from lowtide.core.states import RequestState
from lowtide.core.templates import MessageTemplate
from lowtide.store.db import Store
from lowtide.store.queries import get_job
from lowtide.store.schema import requests


@dataclass(slots=True)
class Upstream:
    job: str
    columns: dict[str, Any] = field(default_factory=dict)  # added to each of its rows
    # Source columns added per row: {stage column: source column} (an eval's expected answer).
    from_source: dict[str, str] = field(default_factory=dict)


def source_values(spec: JobSpec) -> dict[str, dict]:
    """The rows of a job's source by business key (as the loader reads the id cell)."""
    source = source_of(spec)
    id_col = spec.source.id_column
    out: dict[str, dict] = {}
    for chunk in source.chunks():
        for row in chunk:
            key = row.values.get(id_col)
            if key is not None and (text := str(key).strip()):
                out[key_of(text)] = row.values
    return out


def stage_rows(
    store: Store,
    upstream: Iterable[Upstream],
    rows: dict[str, dict],
    keep: Callable[[dict], bool] | None = None,
    states: tuple[str, ...] = (RequestState.SUCCEEDED.value,),
) -> list[dict]:
    out = []
    for up in upstream:
        with store.read() as conn:
            job_id = get_job(conn, up.job).id
            found = conn.execute(
                select(requests.c.custom_id, requests.c.source_key, requests.c.output, requests.c.parsed)
                .where(requests.c.job_id == job_id, requests.c.state.in_(states))
                .order_by(requests.c.id)
            ).all()
        for cid, key, output, parsed in found:
            values = rows.get(key_of(key), {})
            row = {**values, "row_id": cid, "key": key, "output": output, "answer": fastjson.loads(parsed) if parsed else None}
            row |= up.columns | {name: values.get(col) for name, col in up.from_source.items()}
            if keep is None or keep(row):
                out.append(row)
    return out


def write_stage_source(path: Path, rows: list[dict]) -> Path:
    """Write the rows as JSONL, atomically: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        for row in rows:
            f.write(orjson.dumps(row, default=str) + b"\n")
    os.replace(tmp, path)
    return path


def stage_fingerprints(spec: JobSpec, rows: list[dict]) -> dict[str, str] | None:
    """By row_id, the fingerprint each row renders with under the stored stage job's `spec`
    (engine/loader.py): a stored request whose fingerprint differs was rendered from an
    earlier upstream answer or source row. None when the stage's file is gone (cannot tell)."""
    try:
        source = source_of(spec)
    except SourceError:
        return None
    # here: readers of a job's source values (lowtide compare) need no renderer
    from lowtide.engine.loader import RowRenderer

    render = RowRenderer(spec, MessageTemplate.from_spec(spec), source, routes_checked=True)
    out = {}
    for row in rows:
        values = fastjson.loads(orjson.dumps(row, default=str).decode())  # as the stage file gives it back
        out[row["row_id"]] = render.fingerprint(render.values_of(SourceRow(0, None, values)))
    return out
