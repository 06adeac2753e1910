"""What in a job waits on the operator, as sentences `lowtide status` prints (and `--json`
carries as `attention`): a batch held because the provider refused the key while lowtide
looked for it or polled it (engine/held.py), and batches whose results risk expiring at the
provider before they are read (engine/results_window.py `at_risk`)."""

from __future__ import annotations

from sqlalchemy import select

from lowtide.core.clock import Clock
from lowtide.core.spec import JobSpec
from lowtide.core.states import DispatchState
from lowtide.engine.held import HELD
from lowtide.engine.results_window import at_risk
from lowtide.store.db import Store
from lowtide.store.queries import get_job
from lowtide.store.schema import dispatches


def attention(store: Store, name: str, clock: Clock) -> list[str]:
    with store.begin() as conn:
        job = get_job(conn, name)
        spec = JobSpec.model_validate_json(job.spec)
        held = conn.scalars(
            select(dispatches.c.error).where(
                dispatches.c.job_id == job.id,
                dispatches.c.state.in_([DispatchState.SUBMITTING.value, DispatchState.SUBMITTED.value]),
                dispatches.c.error.like(f"{HELD}%"),
            )
        ).all()
        return list(held) + at_risk(conn, job.id, spec.route_options, spec.route, clock.now())
