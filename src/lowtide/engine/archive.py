"""`lowtide prune --archive DIR`: what a prune drops, written to Parquet before it is dropped.

One file per job, `DIR/JOB.YYYYMMDDTHHMMSSZ.parquet`, one row per request row (table
`requests`) or earlier version (table `request_versions`) whose bodies the prune drops,
with what it drops and what identifies it. Written in bounded chunks (a ParquetWriter fed
`CHUNK` rows at a time: memory does not grow with the job), to a hidden `.part` file that is
fsynced, renamed into place, and the folder fsynced: the archive is on disk before the
transaction that drops begins. If any file cannot be written, the files of this run are
removed and nothing is dropped (engine/retention.py `prune`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path

from sqlalchemy import Connection, Select, and_, case, func, literal, null, or_, select

from lowtide.core.errors import InputError
from lowtide.core.states import RequestState
from lowtide.store.payloads import payload_text
from lowtide.store.schema import attempts, request_versions, requests

CHUNK = 5000  # rows per read and per row group

# The archive's columns (its Arrow schema is made where one is written: pyarrow costs every
# `lowtide` command 0.1 s to import, and only `prune --archive` writes one).
COLUMNS = [
    ("table", "string"),  # requests | request_versions
    ("row_id", "int64"),  # the row's id in that table
    ("request_id", "int64"),  # requests.id (for a version: the request it is an earlier version of)
    ("custom_id", "string"),
    ("version", "int64"),
    ("state", "string"),
    # The bodies, as stored; NULL where the prune keeps it (a failed request's payload, the
    # answers under --keep-results, an embedding's response with them) or where there was none.
    ("payload", "string"),
    ("response", "string"),
    ("repair", "string"),
    ("output", "string"),
    ("parsed", "string"),
    ("plain_answer", "string"),
    # What the request's attempts cost in all (the ledger, which the store keeps), in
    # picodollars (10^-12 USD); NULL for an earlier version (its attempts are its request's).
    ("cost_picousd", "int64"),
]


def archive_schema():
    import pyarrow as pa

    return pa.schema([(name, getattr(pa, kind)()) for name, kind in COLUMNS])


def payload_dropped(pruned: str):
    """The requests whose payload a prune drops: succeeded ones with a fingerprint (m008)."""
    r = requests.c
    return (r.state == RequestState.SUCCEEDED.value) & r.fingerprint.is_not(None) & (r.payload != pruned)


# `keep_results` keeps the answers. An embedding job's answer is its vector, which only its
# stored response holds (`vectors`): kept with them, its response is not dropped.


def request_bodies(keep_results: bool, vectors: bool = False) -> tuple:
    """The request columns a prune drops."""
    r = requests.c
    if keep_results:
        return (r.repair,) if vectors else (r.response, r.repair)
    return (r.response, r.repair, r.output, r.parsed, r.plain_answer)


def version_bodies(keep_results: bool, vectors: bool = False) -> tuple:
    """The earlier versions' columns a prune drops, besides the payload."""
    v = request_versions.c
    if keep_results:
        return () if vectors else (v.response,)
    return (v.response, v.output, v.parsed)


def dropped_requests(job_id: int, keep_results: bool, pruned: str, vectors: bool = False):
    """The job's request rows a prune changes (the same filter as its UPDATEs)."""
    r = requests.c
    has_body = or_(*(c.is_not(None) for c in request_bodies(keep_results, vectors)))
    return and_(r.job_id == job_id, or_(has_body, payload_dropped(pruned)))


def dropped_versions(job_id: int, keep_results: bool, pruned: str, vectors: bool = False):
    """The job's earlier versions a prune changes: a payload, or a body it drops, still there."""
    v = request_versions.c
    return and_(v.job_id == job_id, or_(v.payload != pruned, *(c.is_not(None) for c in version_bodies(keep_results, vectors))))


def _rows(job_id: int, keep_results: bool, pruned: str, vectors: bool = False) -> list[Select]:
    r, v, a = requests.c, request_versions.c, attempts.c
    cost = select(func.sum(a.cost_picousd)).where(a.request_id == r.id).scalar_subquery()
    answer = (lambda c: null()) if keep_results else (lambda c: c)
    response = answer if vectors else (lambda c: c)
    of_requests = (
        select(
            literal("requests"), r.id, r.id, r.custom_id, r.version, r.state,
            case((payload_dropped(pruned), payload_text(requests)), else_=null()), response(r.response), r.repair,
            answer(r.output), answer(r.parsed), answer(r.plain_answer), cost,
        )  # fmt: skip
        .where(dropped_requests(job_id, keep_results, pruned, vectors))
        .order_by(r.id)
    )
    of_versions = (
        select(
            literal("request_versions"), v.id, v.request_id, r.custom_id, v.version, v.state,
            case((v.payload != pruned, payload_text(request_versions)), else_=null()), response(v.response), null(), answer(v.output),
            answer(v.parsed), null(), null(),
        )  # fmt: skip
        .join(requests, r.id == v.request_id)
        .where(dropped_versions(job_id, keep_results, pruned, vectors))
        .order_by(v.id)
    )
    return [of_requests, of_versions]


def archive_name(job: str, now: float, n: int = 1) -> str:
    """JOB.YYYYMMDDTHHMMSSZ.parquet; the n-th archive of the job in that second: .N before .parquet."""
    return f"{job}.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}{'' if n == 1 else f'.{n}'}.parquet"


def _new_path(folder: Path, job: str, now: float) -> Path:
    """The first archive name of the job at `now` not taken in `folder`: a second prune in the
    same second (a `--keep-results` one, then one that drops the answers too) writes beside
    the first, never over it nor refusing for it."""
    return next(path for n in itertools.count(1) if not (path := folder / archive_name(job, now, n)).exists())


def write_archives(conn: Connection, folder: Path, cuts: list, now: float, pruned: str) -> dict[str, Path]:
    """Write each cut's (job_id, name, keep_results, vectors) archive under `folder`; {job: path}.
    InputError naming the folder and the fix if any cannot be written; then none is left."""
    import pyarrow as pa

    written: dict[str, Path] = {}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for cut in cuts:
            path = _new_path(folder, cut.name, now)
            _write(conn, path, _rows(cut.job_id, cut.keep_results, pruned, cut.vectors))
            written[cut.name] = path
        _fsync_dir(folder)
    except (OSError, pa.ArrowException) as err:
        for path in written.values():
            with contextlib.suppress(OSError):
                path.unlink()
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise InputError(
            f"--archive {folder}: cannot write the archive there ({why}); nothing was pruned. Give --archive a "
            "directory you can write to, with room for the bodies (it is created if missing), or prune without --archive"
        ) from None
    return written


def _write(conn: Connection, path: Path, queries: list[Select]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = archive_schema()
    part = path.with_name(f".{path.name}.part")
    try:
        with part.open("wb") as f:
            with pq.ParquetWriter(f, schema, compression="zstd") as writer:
                for query in queries:
                    result = conn.execute(query.execution_options(yield_per=CHUNK))
                    for chunk in result.partitions():
                        columns = list(zip(*chunk, strict=True)) if chunk else [[] for _ in schema]
                        writer.write_batch(pa.record_batch([pa.array(c, type=t.type) for c, t in zip(columns, schema, strict=True)], schema=schema))
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, path)
    except BaseException:
        with contextlib.suppress(OSError):
            part.unlink()
        raise


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
