"""An embedding job's results: vectors as Parquet, JSONL or .npy, or upserted into a
PostgreSQL table (docs/embeddings.md "Results").

Rows come from the store in load order (the source's order on a first load), a page at a
time, so a million vectors are written in bounded memory. Each row: the source's id column
(the business key), custom_id, state, the vector, error, input_tokens, source_changed.

`source_changed` is true where the row, rendered now, is not what its vector was made from
(its text changed under the same id, or the template did: export.py): told by a pass over
the source in source order first, which keeps only the changed rows' request ids (a sorted
array, 8 bytes each), then looked up as the store's pages go by. Null where it cannot be
told (the source or a template file gone since).

- `.parquet`: `embedding` is `fixed_size_list<float32>[n]`, null where the row has no vector;
- `.jsonl`: `embedding` is an array of numbers (float32 values, as Parquet holds them);
- `.npy`: a float32 matrix of the succeeded rows only, one row each, and beside it
  `<name>.ids.txt`: the business key of matrix row i on line i (`x.npy` → `x.ids.txt`).
  It cannot mark a row, so it is refused while a succeeded row is changed;
- PostgreSQL: a `source_changed` column beside each vector (added to an older table).
"""

from __future__ import annotations

import io
import json
import re
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sqlalchemy import func, select

from lowtide.core import fastjson
from lowtide.core.embeddings import vector_of
from lowtide.core.errors import InputError, LowtideError
from lowtide.core.locations import Location, location
from lowtide.core.spec import stored_spec
from lowtide.engine.committed import committed
from lowtide.store.db import Store
from lowtide.store.queries import get_job
from lowtide.store.schema import requests

PAGE = 2000
FORMATS = (".parquet", ".jsonl", ".npy")


@dataclass(slots=True)
class VectorRow:
    key: str
    custom_id: str
    state: str
    vector: list[float] | None
    error: str | None
    input_tokens: int | None
    changed: bool | None = None  # source_changed; None where it cannot be told


class ChangedRows:
    """The request ids of a job's rows changed since they were stored, sorted (8 bytes each)."""

    def __init__(self, ids: Iterator[int]):
        self.ids = array("q", sorted(ids))

    def __contains__(self, request_id: int) -> bool:
        i = bisect_left(self.ids, request_id)
        return i < len(self.ids) and self.ids[i] == request_id


def changed_rows(store: Store, job_name: str) -> ChangedRows | None:
    """The job's changed rows, from a pass over its source (export.py `ResultRows`); None
    where the source or a template cannot be read now, so changes cannot be told."""
    from lowtide.engine.export import ResultRows

    try:
        rows = ResultRows(store, job_name)
    except LowtideError:
        return None
    if rows.render is None:
        return None
    return ChangedRows(rows.changed_requests())


def vector_rows(store: Store, job_id: int, changed: ChangedRows | None = None) -> Iterator[VectorRow]:
    after = 0
    c = requests.c
    while True:
        with store.read() as conn:
            page = conn.execute(
                select(c.id, c.source_key, c.custom_id, c.state, c.response, c.error_code, c.error_message, c.input_tokens)
                # `job_id + 0`: read along the primary key from `after`, never through the
                # job's index (which would sort every row of the job again for each page).
                .where((c.job_id + 0) == job_id, c.id > after).order_by(c.id).limit(PAGE)
            ).all()  # fmt: skip
        for r in page:
            vector = vector_of(fastjson.loads(r.response)) if r.response is not None and r.state == "succeeded" else None
            error = f"{r.error_code}: {r.error_message}" if r.error_code else None
            was_changed = None if changed is None else r.id in changed
            yield VectorRow(r.source_key, r.custom_id, r.state, vector, error, r.input_tokens, was_changed)
        if len(page) < PAGE:
            return
        after = page[-1].id


def _dimensions(store: Store, job_id: int) -> int:
    """The vector length of the job's first succeeded row (0 when none has one)."""
    for row in vector_rows(store, job_id):
        if row.vector is not None:
            return len(row.vector)
    return 0


@dataclass(slots=True)
class VectorReport:
    path: Path | str  # a local file, or an object-store URL
    rows: int
    states: dict[str, int]


def export_vectors(store: Store, job_name: str, out: str | Path) -> VectorReport:
    """Write the job's vectors to `out` (a local path or an object-store URL), whole or not
    at all (committed.py); .npy with its ids file beside it."""
    loc = location(str(out))
    suffix = Path(loc.path.rsplit("/", 1)[-1]).suffix.lower()
    if suffix not in FORMATS:
        raise InputError(f"{out}: an embedding job's results are written as {', '.join(FORMATS)}; pick one of those extensions")
    with store.read() as conn:
        job = get_job(conn, job_name)
    spec = stored_spec(job.spec)
    n = _dimensions(store, job.id)
    changed = changed_rows(store, job_name)
    states: dict[str, int] = {}
    count = 0
    if suffix == ".npy":
        count = _write_npy(store, job.id, loc, n, states, changed)
    else:
        with committed(loc) as f:
            writer = (_Parquet if suffix == ".parquet" else _Jsonl)(f, spec.source.id_column, n)
            for row in vector_rows(store, job.id, changed):
                if row.vector is not None and len(row.vector) != n:
                    raise LowtideError(f"{job_name}: row {row.key} has a vector of {len(row.vector)} numbers, others {n}; "
                                       "one file holds one length (re-run the job with one `dimensions`)")  # fmt: skip
                states[row.state] = states.get(row.state, 0) + 1
                writer.write(row)
                count += 1
            writer.close()
    return VectorReport(Path(str(out)) if loc.local else loc.text, count, states)


class _Parquet:
    def __init__(self, f: IO[bytes], id_column: str, n: int):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa = pa
        self.schema = pa.schema([
            (id_column, pa.string()), ("custom_id", pa.string()), ("state", pa.string()),
            ("embedding", pa.list_(pa.float32(), max(n, 1))), ("error", pa.string()), ("input_tokens", pa.int64()),
            ("source_changed", pa.bool_()),
        ])  # fmt: skip
        self.writer = pq.ParquetWriter(f, self.schema)  # closing it leaves `f` open
        self.rows: list[VectorRow] = []

    def write(self, row: VectorRow) -> None:
        self.rows.append(row)
        if len(self.rows) >= PAGE * 5:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        pa, rows = self.pa, self.rows
        columns = [
            pa.array([r.key for r in rows], pa.string()), pa.array([r.custom_id for r in rows], pa.string()),
            pa.array([r.state for r in rows], pa.string()),
            pa.array([r.vector for r in rows], self.schema.field("embedding").type),
            pa.array([r.error for r in rows], pa.string()), pa.array([r.input_tokens for r in rows], pa.int64()),
            pa.array([r.changed for r in rows], pa.bool_()),
        ]  # fmt: skip
        self.writer.write_table(pa.Table.from_arrays(columns, schema=self.schema))
        self.rows = []

    def close(self) -> None:
        self.flush()
        self.writer.close()


class _Jsonl:
    def __init__(self, f: IO[bytes], id_column: str, n: int):
        from array import array

        self.array = array
        self.f = f
        self.id_column = id_column

    def write(self, row: VectorRow) -> None:
        # float32 values, as the Parquet and .npy files hold them: one file's numbers agree with another's.
        vector = None if row.vector is None else self.array("f", row.vector).tolist()
        line = {self.id_column: row.key, "custom_id": row.custom_id, "state": row.state, "embedding": vector,
                "error": row.error, "input_tokens": row.input_tokens, "source_changed": row.changed}  # fmt: skip
        self.f.write(fastjson.dumpb(line) + b"\n")

    def close(self) -> None:
        self.f.flush()


def ids_path(npy: Path) -> Path:
    return npy.with_suffix(".ids.txt")


def _ids_location(npy: Location) -> Location:
    """The `.ids.txt` file beside a `.npy` file, in the same store."""
    stem = npy.path[: -len(".npy")]
    text = npy.text[: -len(".npy")] + ".ids.txt"
    return Location(text, npy.fs, stem + ".ids.txt", npy.local)


def _write_npy(store: Store, job_id: int, out: Location, n: int, states: dict[str, int], changed: ChangedRows | None) -> int:
    """The succeeded rows' vectors as one float32 matrix, streamed; their keys beside it.
    Both are committed only when both are whole. A matrix cannot say that a row's vector is
    for its old text: a succeeded row changed since is refused, named."""
    import numpy as np
    from numpy.lib import format as npformat

    with store.read() as conn:
        total = conn.execute(
            select(func.count()).select_from(requests).where(requests.c.job_id == job_id, requests.c.state == "succeeded")
        ).scalar_one()
    name = out.path.rsplit("/", 1)[-1]
    written = 0
    with committed(out) as f, committed(_ids_location(out)) as raw_ids:
        ids = io.TextIOWrapper(raw_ids, encoding="utf-8", write_through=True)
        npformat.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (total, n)})
        for row in vector_rows(store, job_id, changed):
            states[row.state] = states.get(row.state, 0) + 1
            if row.vector is None:
                continue
            if row.changed:
                raise LowtideError(_changed_refusal(name, row.key, changed))
            if len(row.vector) != n or "\n" in row.key or written >= total:
                raise LowtideError(f"row {row.key}: cannot go into {name} (a vector of another length, a key with a "
                                   "line break, or rows added while exporting); use .parquet or .jsonl")  # fmt: skip
            f.write(np.asarray(row.vector, dtype="<f4").tobytes())
            ids.write(row.key + "\n")
            written += 1
        if written != total:
            raise LowtideError(f"{name}: {total - written} succeeded row(s) changed while exporting; export again")
        ids.flush()
        ids.detach()
    return sum(states.values())


def _changed_refusal(name: str, key: str, changed: ChangedRows | None) -> str:
    count = len(changed.ids) if changed is not None else 1
    return (f"{name}: {count:,} row(s) changed since their vectors were made (row {key} first); a .npy cannot mark "
            "them: run the job again with --requeue-changed, or write .parquet or .jsonl (their source_changed column marks them)")  # fmt: skip


# PostgreSQL ----------------------------------------------------------------------------
TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$")


def upsert_vectors(store: Store, job_name: str, url: str, table: str) -> dict[str, Any]:
    """Upsert the job's succeeded vectors into `table` at `url`, keyed by the business key:
    a row is written only where its vector, model or source_changed changed. The table is made
    if missing: `id text primary key, embedding vector(n)` where the pgvector extension is
    installed in that database (else `float4[]`), `model text, custom_id text, updated_at
    timestamptz, source_changed boolean` (true: the vector is for the row's old text; null:
    not known); a table made before source_changed gets the column."""
    import sqlalchemy as sa

    if not TABLE_NAME.match(table):
        raise InputError(f"--pg-table {table!r}: use a plain table name (letters, digits, _), optionally schema.table")
    with store.read() as conn:
        job = get_job(conn, job_name)
    spec = stored_spec(job.spec)
    n = _dimensions(store, job.id)
    changed = changed_rows(store, job_name)
    marked = 0
    quoted = ".".join(f'"{part}"' for part in table.split("."))
    engine = sa.create_engine(url if "+" in url.split("://", 1)[0] else url.replace("postgresql://", "postgresql+psycopg://", 1))
    written = 0
    try:
        with engine.begin() as pg:
            pgvector = pg.execute(sa.text("select 1 from pg_extension where extname = 'vector'")).first() is not None
            column = f"vector({n})" if pgvector and n else "float4[]"
            pg.execute(sa.text(f"create table if not exists {quoted} (id text primary key, embedding {column} not null, "
                               "model text not null, custom_id text not null, updated_at timestamptz not null default now())"))  # fmt: skip
            pg.execute(sa.text(f"alter table {quoted} add column if not exists source_changed boolean"))
            cast = "cast(:embedding as vector)" if pgvector and n else "cast(:embedding as float4[])"
            upsert = sa.text(
                f"insert into {quoted} as t (id, embedding, model, custom_id, source_changed) "
                f"values (:id, {cast}, :model, :custom_id, :source_changed) "
                "on conflict (id) do update set embedding = excluded.embedding, model = excluded.model, "
                "custom_id = excluded.custom_id, source_changed = excluded.source_changed, updated_at = now() "
                "where t.embedding is distinct from excluded.embedding or t.model is distinct from excluded.model "
                "or t.source_changed is distinct from excluded.source_changed"
            )
            batch: list[dict[str, Any]] = []
            for row in vector_rows(store, job.id, changed):
                if row.vector is None:
                    continue
                marked += bool(row.changed)
                text = json.dumps(row.vector) if pgvector and n else "{" + ",".join(map(repr, row.vector)) + "}"
                batch.append({"id": row.key, "embedding": text, "model": spec.model, "custom_id": row.custom_id,
                              "source_changed": row.changed})  # fmt: skip
                if len(batch) >= PAGE:
                    written += pg.execute(upsert, batch).rowcount
                    batch = []
            if batch:
                written += pg.execute(upsert, batch).rowcount
    finally:
        engine.dispose()
    return {"table": table, "column": column, "changed": written, "source_changed": marked}
