"""A batch's pack answer ingested after an earlier ingest of the same batch broke off: the
rows already applied keep their result (applied once), the others get their own vectors by
position. The broken-off state is made with the engine's own `apply_outcomes`."""

from __future__ import annotations

import asyncio
import json
import random

import sqlalchemy as sa

from lowtide.core.embeddings import vector_of
from lowtide.core.spec import build_spec
from lowtide.core.types import Outcome, Usage
from lowtide.engine.context import JobContext
from lowtide.engine.ingest import apply_outcomes
from lowtide.engine.loader import load_job
from lowtide.engine.packs import stored_members
from lowtide.engine.tick import Engine
from lowtide.store.payloads import payload_text
from lowtide.store.schema import attempts, dispatches, jobs, requests
from tests.conftest import write_csv
from tests.embeddings.helpers import docs, echo_reference, embed_spec


def test_a_pack_is_unpacked_right_after_a_partial_ingest(store, clock, tmp_path):  # SQLite and PostgreSQL
    source = write_csv(tmp_path / "docs.csv", docs(10))
    options = {"dir": str(tmp_path / "provider"), "polls_to_complete": 3}
    spec = build_spec(embed_spec(source, route="echo-batch", route_options=options))
    load_job(store, spec, clock)

    async def ticks(n: int) -> None:
        async with Engine(store, clock, seed=1) as engine:
            for _ in range(n):
                await engine.tick("vectors")
                clock.advance(3600)

    asyncio.run(ticks(1))  # planned and submitted as one pack of 10; not ended yet
    with store.begin() as conn:
        dispatch_id = conn.execute(sa.select(dispatches.c.id)).scalar_one()
        rows = conn.execute(sa.select(requests.c.id, requests.c.custom_id, payload_text().label("payload")).order_by(requests.c.id)).all()
        job = JobContext.from_row(conn.execute(sa.select(jobs)).one())
        # An ingest that broke off after the first three rows of the pack.
        early = [Outcome(r.custom_id, True, usage=Usage(input_tokens=1), response={"object": "list", "data": [
            {"object": "embedding", "index": 0, "embedding": [9.0] * 8}]}) for r in rows[:3]]  # fmt: skip
        apply_outcomes(conn, job, dispatch_id, "echo-batch", early, clock.now(), random.Random(1))
        assert stored_members(conn, job.id, dispatch_id, rows[0].id, rows[-1].id, 10) == [r.custom_id for r in rows]
    asyncio.run(ticks(6))
    with store.begin() as conn:
        got = conn.execute(sa.select(requests.c.custom_id, requests.c.state, requests.c.response).order_by(requests.c.id)).all()
        per_row = conn.execute(sa.select(attempts.c.request_id, sa.func.count()).group_by(attempts.c.request_id)).all()
    assert [g.state for g in got] == ["succeeded"] * 10
    assert all(n == 1 for _, n in per_row)  # one attempt each: nothing applied twice
    for r, g in zip(rows, got, strict=True):
        vector = vector_of(json.loads(g.response))
        if r in rows[:3]:
            assert vector == [9.0] * 8  # the first result stands (applied at most once)
        else:
            assert vector == echo_reference(json.loads(r.payload)["body"]["input"], 8)
