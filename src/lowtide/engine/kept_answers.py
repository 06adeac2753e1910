"""`prune --keep-results`: the answer columns of each response it drops, kept in its place.

The export reads a row's answer columns (answer_columns.py) from its stored response, or, for
a plain answer (one chat choice of text alone), from the record ingest keeps beside it
(`requests.plain_answer`). `--keep-results` drops the response and keeps the answers: where
no plain record would be left to read (any other answer: tool calls, a refusal, reasoning,
logprobs, n > 1; an answer stored before m017; a row whose payload the prune keeps, which the
export does not take for a pruned one), the row's answer columns are first written into
`plain_answer` as one JSON object (`kept_record`), by the statement that drops its bodies, so
each row is still rewritten once (retention.py `_drop`). Read in pages of at most PAGE rows
and PAGE_BYTES of responses: memory does not grow with the job.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, bindparam, func, or_, select, update

from lowtide.core import fastjson
from lowtide.engine.answer_columns import kept_record
from lowtide.engine.archive import payload_dropped
from lowtide.store.bulk import among, executemany
from lowtide.store.queries import stored_bytes
from lowtide.store.schema import requests

PAGE = 5000  # rows whose response lengths are read at once
PAGE_BYTES = 8 << 20  # responses read at once, at most (one bigger response is read alone)


def needs_record(pruned: str) -> ColumnElement[bool]:
    """The rows whose response the prune drops and whose answer columns nothing else
    would give once it is gone: no plain record, or one beside a payload that is kept (only a
    pruned payload tells the export a plain record outlived its response on purpose)."""
    r = requests.c
    payload_kept = and_(r.payload != pruned, ~payload_dropped(pruned))
    return and_(r.response.is_not(None), or_(r.plain_answer.is_(None), payload_kept))


def keep_answers(conn: Connection, job_id: int, pruned: str, dropped: dict[str, Any]) -> tuple[int, int]:
    """Drop the bodies of the job's rows that need a kept record (`dropped`: the values the
    prune sets on a row) and write the record, by one UPDATE for each row; (rows, bytes (UTF-8)
    of the records written)."""
    r = requests.c
    stmt = update(requests).where(r.id == bindparam("_id")).values(**dropped, plain_answer=bindparam("record"))
    rows = kept = 0
    first = conn.execute(select(func.min(r.id)).where(r.job_id == job_id)).scalar()
    if first is None:
        return rows, kept
    after = first - 1
    while True:
        # `job_id + 0`: read along the primary key from `after`, never through the job's index
        # (which would sort the job's rows left again for each page).
        page = conn.execute(
            select(r.id, stored_bytes(r.response))
            .where((r.job_id + 0) == job_id, needs_record(pruned), r.id > after)
            .order_by(r.id)
            .limit(PAGE)
        ).all()
        for ids in _runs(page):
            found = conn.execute(select(r.id, r.response).where(among(conn, r.id, ids))).all()
            records = [{"_id": rid, "record": kept_record(fastjson.loads(text))} for rid, text in found]
            executemany(conn, stmt, records, by_key=True)
            rows += len(records)
            kept += sum(len(rec["record"].encode("utf-8", "surrogatepass")) for rec in records)
        if len(page) < PAGE:
            return rows, kept
        after = page[-1][0]


def _runs(page: list) -> Iterator[list[int]]:
    """The page's ids in runs whose responses add up to at most PAGE_BYTES."""
    run: list[int] = []
    size = 0
    for rid, length in page:
        if run and size + (length or 0) > PAGE_BYTES:
            yield run
            run, size = [], 0
        run.append(rid)
        size += length or 0
    if run:
        yield run
