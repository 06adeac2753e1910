"""Jobs built straight in the store for the ledger tests: requests in a dispatch of a named
route, to which `apply_outcomes` (the engine's own ingest) applies outcomes with explicit
provider usage figures."""

from __future__ import annotations

import json
import random

import sqlalchemy as sa

from lowtide.core.states import DispatchState, RequestState
from lowtide.core.types import Outcome, Request, Usage
from lowtide.engine.context import JobContext
from lowtide.engine.dispatch import assign, new_dispatch
from lowtide.engine.ingest import IngestCounts, apply_outcomes
from lowtide.store.queries import save_job
from lowtide.store.schema import attempts, jobs, requests
from lowtide.store.transitions import move_requests
from tests.conftest import make_spec

NOW = 1_700_000_000.0


def stored_job(store, tmp_path, n: int = 3, **spec) -> JobContext:
    """A job with `n` pending requests r0…r{n-1} (no route is contacted)."""
    spec = make_spec(tmp_path / "unused.csv", **spec)
    with store.begin() as conn:
        job_id, _ = save_job(conn, spec.name, spec.model_dump_json(), spec.route, NOW)
        rows = [
            {
                "job_id": job_id, "custom_id": f"r{i}", "source_key": f"r{i}", "source_row": i + 1,
                "payload": json.dumps(Request.chat(f"r{i}", spec.model, [{"role": "user", "content": "x" * 40}], max_tokens=spec.output_limit or 256).to_payload()),
                "state": RequestState.PENDING.value, "attempts": 0, "not_before": 0.0, "model": spec.model,  # as the loader stores it
            }
            for i in range(n)
        ]  # fmt: skip
        conn.execute(sa.insert(requests), rows)
        return JobContext.from_row(conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).one())


def dispatch(store, job: JobContext, route: str, ids: list[str], kind: str = "batch") -> int:
    """Put the pending requests `ids` into a new dispatch of `route` (as if sent)."""
    with store.begin() as conn:
        state = DispatchState.SUBMITTED if kind == "batch" else DispatchState.RUNNING
        dispatch_id = new_dispatch(conn, job.id, route, kind, state, NOW)
        rows = conn.execute(sa.select(requests.c.id).where(requests.c.job_id == job.id, requests.c.custom_id.in_(ids))).scalars().all()
        assign(conn, dispatch_id, list(rows), route, NOW)
    return dispatch_id


def ingest(store, job: JobContext, dispatch_id: int, route: str, outcomes: list[Outcome], now: float = NOW) -> IngestCounts:
    with store.begin() as conn:
        return apply_outcomes(conn, job, dispatch_id, route, outcomes, now, random.Random(1))


def release(store, dispatch_id: int) -> None:
    """The requests leave their dispatch without a result (a deadline cut-over's release)."""
    with store.begin() as conn:
        move_requests(
            conn, RequestState.PENDING,
            sa.and_(requests.c.dispatch_id == dispatch_id, requests.c.state == RequestState.DISPATCHED.value),
            values={"dispatch_id": None, "lane": "fallback"},
        )  # fmt: skip


def ok(cid: str, **usage: int) -> Outcome:
    return Outcome(cid, True, text="billing", usage=Usage(**usage), finish_reason="stop")


def attempt_rows(store) -> dict[tuple[str, int], sa.Row]:
    """(custom_id, dispatch_id) -> the attempt row."""
    with store.begin() as conn:
        rows = conn.execute(sa.select(requests.c.custom_id, attempts).join(requests, requests.c.id == attempts.c.request_id)).all()
    return {(r.custom_id, r.dispatch_id): r for r in rows}
