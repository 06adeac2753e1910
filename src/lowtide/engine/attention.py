"""What in a job waits on the operator, as sentences `lowtide status` prints (and `--json`
carries as `attention`): a batch held because the provider refused the key while lowtide
looked for it or polled it (engine/held.py), batches whose results risk expiring at the
provider before they are read (engine/results_window.py `at_risk`), and batches given up as
lost that are still polled for what they bill (engine/batches.py `_watch`): a worker must keep
running for their bill to be booked, and moving the route or deleting the job ends that."""

from __future__ import annotations

from sqlalchemy import select

from lowtide.core.auto_spec import duration_text
from lowtide.core.clock import Clock
from lowtide.core.spec import stored_spec
from lowtide.core.states import DispatchState
from lowtide.engine.held import HELD
from lowtide.engine.results_window import at_risk
from lowtide.store.db import Store
from lowtide.store.queries import get_job, watched
from lowtide.store.schema import dispatches


def attention(store: Store, name: str, clock: Clock) -> list[str]:
    with store.read() as conn:
        job = get_job(conn, name)
        spec = stored_spec(job.spec)
        held = conn.scalars(
            select(dispatches.c.error).where(
                dispatches.c.job_id == job.id,
                dispatches.c.state.in_([DispatchState.SUBMITTING.value, DispatchState.SUBMITTED.value]),
                dispatches.c.error.like(f"{HELD}%"),
            )
        ).all()
        now = clock.now()
        return list(held) + at_risk(conn, job.id, spec.route_options, spec.route, now) + _watched(conn, job.id, now)


def _watched(conn, job_id: int, now: float) -> list[str]:
    """A sentence per batch given up as lost whose watch is open."""
    d = dispatches.c
    rows = conn.execute(select(d.route, d.provider_id, d.watch_until).where(d.job_id == job_id, watched()).order_by(d.id)).all()
    return [
        f"batch {provider_id} on {route} was given up as lost and its requests sent again; it is still polled for what "
        f"the provider bills for it, for {duration_text(max(until - now, 0.0))} more: keep a worker running to book that; "
        "moving the route or deleting the job ends the watch unbooked (docs/guarantees.md)"
        for route, provider_id, until in rows
    ]
