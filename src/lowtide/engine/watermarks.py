"""Nightly increments' watermarks (`source.since`, docs/data.md): the highest value of the
job's `since` column among the rows its loads stored, kept in the store (schema.py
`watermarks`), moved in the load's own transaction and never moved back."""

from __future__ import annotations

from sqlalchemy import Connection, select, update

from lowtide.core.errors import SourceError
from lowtide.core.sources import Source, Watermark, compare_values
from lowtide.core.spec import JobSpec
from lowtide.store.db import Store
from lowtide.store.schema import jobs, watermarks


def stored_watermark(store: Store, spec: JobSpec) -> Watermark | None:
    """The stored watermark of a `since` job (None on its first load, or without `since`).
    One kept for another column is not used: the spec's column changed, all rows are read."""
    if spec.source.since is None:
        return None
    with store.read() as conn:
        row = conn.execute(
            select(watermarks.c.column, watermarks.c.value).join(jobs, jobs.c.id == watermarks.c.job_id).where(jobs.c.name == spec.name)
        ).first()
    if row is None or row.column != spec.source.since.column:
        return None
    return Watermark.from_json(row.column, row.value)


def check_forward(source: Source, after: Watermark) -> None:
    """No row past the watermark: nothing new, unless the column went backwards (the
    source was replaced by older data, or the column rewritten), which is refused."""
    highest = source.highest_of(after.column)
    if highest is None:
        raise SourceError(f"source {source.label} has no rows; nothing was stored. Fill it, or point source.path at the right one")
    if compare_values(highest, after.value) < 0:
        raise SourceError(
            f"{source.label}: source.since column \"{after.column}\" went backwards: its highest value is now "
            f"{Watermark(after.column, highest).shown()}, and the last load stored rows up to {after.shown()}. "
            "Nothing was stored. If the source was rebuilt, rename the job (or `lowtide delete` it) to load it afresh"
        )


def save_watermark(conn: Connection, job_id: int, spec: JobSpec, source: Source, after: Watermark | None, now: float) -> Watermark | None:
    """Move a `since` job's watermark up to the highest value this load stored (never down)."""
    if spec.source.since is None:
        return None
    if source.highest is None:
        return after
    mark = Watermark(spec.source.since.column, source.highest)
    if after is not None and compare_values(mark.value, after.value) <= 0:
        return after
    values = {"column": mark.column, "value": mark.to_json(), "updated_at": now}
    if conn.execute(update(watermarks).where(watermarks.c.job_id == job_id).values(**values)).rowcount == 0:
        conn.execute(watermarks.insert().values(job_id=job_id, **values))
    return mark
