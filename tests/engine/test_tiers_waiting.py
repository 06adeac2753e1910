"""A chain's per-tick pass (engine/tiers.py) reads pending requests by lane only where a
decision needs them: a quiet tick costs the same however many requests wait, and the moves
it makes are those of counting every lane first. On both stores, but the cost test, which
counts SQLite's own steps (deterministic; no clock)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import sqlalchemy as sa

from lowtide.core.clock import ManualClock
from lowtide.core.spec import JobSpec
from lowtide.core.types import Request
from lowtide.engine import tiers
from lowtide.engine.context import JobContext
from lowtide.engine.dispatch import pending_ids
from lowtide.engine.fallback import move_pending
from lowtide.store.queries import save_job
from lowtide.store.schema import dispatches, events, jobs, requests
from tests.sqlite_steps import sqlite_steps

NOW = 1_700_000_000.0
END = NOW + 7200
KINDS = ["batch", "direct", "direct"]  # echo-batch, then echo twice (tier1 answers "message")


def _spec(name: str) -> JobSpec:
    tier1 = {"route": "echo", "route_options": {"answer": "message"}}
    return JobSpec.model_validate({
        "name": name, "source": {"path": "unused.csv", "id_column": "id"}, "template": {"user": "{{ body }}"},
        "model": "team-model", "route": "echo-batch", "params": {"max_tokens": 16},
        "deadline": datetime.fromtimestamp(END, UTC).isoformat(),
        "auto": {"max_wait": "2h", "chosen": "echo-batch", "candidates": [{"route": "echo-batch"}, tier1, {"route": "echo"}],
                 "chain": [{"route": "echo-batch", "margin": 0}, {**tier1, "margin": 600}, {"route": "echo", "margin": 60}]},
    })  # fmt: skip


def _job(store, name: str, lanes: dict[str, int], state: str = "pending") -> JobContext:
    """A decided chain job with `lanes[lane]` requests on each lane (ids in that order)."""
    spec = _spec(name)
    payload = json.dumps(Request.chat("x", spec.model, [{"role": "user", "content": "y"}], max_tokens=16).to_payload())
    with store.begin() as conn:
        job_id, _ = save_job(conn, name, spec.model_dump_json(), spec.route, NOW)
        rows, i = [], 0
        for lane, n in lanes.items():
            for _ in range(n):
                rows.append({"job_id": job_id, "custom_id": f"r{i}", "source_key": f"r{i}", "source_row": i + 1, "payload": payload,
                             "state": state, "attempts": 1, "not_before": 0.0, "model": spec.model, "lane": lane})  # fmt: skip
                i += 1
        for start in range(0, len(rows), 5000):
            conn.execute(sa.insert(requests), rows[start : start + 5000])
        return JobContext.from_row(conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).one())


def _history(store, route: str, kind: str, seconds: float) -> None:
    """Three ended dispatches of `route` that took `seconds` (a batch; a request, direct)."""
    with store.begin() as conn:
        job_id = conn.execute(
            sa.insert(jobs).values(name=f"earlier-{route}", spec="{}", route=route, state="finished", created_at=0, updated_at=0)
        ).inserted_primary_key[0]
        for i in range(3):
            conn.execute(sa.insert(dispatches).values(
                job_id=job_id, route=route, kind=kind, key=f"earlier-{route}-{i}", state="ended", size=1, polls=1,
                cancel_requested=False, created_at=1000, submitted_at=1000, ended_at=1000 + seconds, model="team-model",
            ))  # fmt: skip


def _lanes(store, job: JobContext) -> dict[str, str]:
    with store.begin() as conn:
        return dict(conn.execute(sa.select(requests.c.custom_id, requests.c.lane).where(requests.c.job_id == job.id)).all())


def test_a_quiet_tick_reads_as_much_for_20000_waiting_requests_as_for_2000(sqlite_store):
    # echo-batch's prior p95 (5 s) fits: nothing moves; flex-like tier1 waits empty.
    small, large = _job(sqlite_store, "small", {"main": 2000}), _job(sqlite_store, "large", {"main": 20_000})
    clock = ManualClock(NOW)
    cost = {}
    for job in (small, large):
        tiers.step(sqlite_store, job, KINDS, clock)  # statements prepared once
        with sqlite_steps(sqlite_store) as steps:
            assert tiers.step(sqlite_store, job, KINDS, clock) == 0
        cost[job.name] = steps[0]
    # Counting every pending row, the large job took about ten times the small one's.
    assert cost["large"] <= cost["small"] + 20, cost


def test_a_tier_reads_its_due_requests_without_reading_the_other_lanes_waiting(sqlite_store):
    """The index of pending requests by lane is partial (pending rows only, off the query's
    literal state): a tier's claim and the count asked for its speed read as much whether
    2,000 or 20,000 requests wait on the tier below."""
    small = _job(sqlite_store, "small", {"main": 2000, "tier1": 20})
    large = _job(sqlite_store, "large", {"main": 20_000, "tier1": 20})
    cost = {}

    def read(job: JobContext) -> tuple[list[int], int]:
        with sqlite_store.begin() as conn:
            ids = pending_ids(conn, job.id, NOW, 10, lane="tier1")
            return ids, move_pending(conn, job.id, NOW, "test", src="tier1", dst="tier1", keep=10)

    for job in (small, large):
        read(job)  # statements prepared once
        with sqlite_steps(sqlite_store) as steps:
            ids, moved = read(job)
        assert len(ids) == 10 and moved == 10
        cost[job.name] = steps[0]
    assert cost["large"] <= cost["small"] + 20, cost


def test_requests_on_lanes_the_chain_does_not_have_start_again_on_the_chosen_tier(store):
    job = _job(store, "j", {"main": 2, "fallback": 2, "tier1": 1, "tier7": 1})
    with store.begin() as conn:  # a request done on a lane of before stays where it ran
        conn.execute(sa.update(requests).where(requests.c.custom_id == "r5").values(state="succeeded"))
    assert tiers.step(store, job, KINDS, ManualClock(NOW)) == 2
    assert _lanes(store, job) == {"r0": "main", "r1": "main", "r2": "main", "r3": "main", "r4": "tier1", "r5": "tier7"}
    with store.begin() as conn:
        rows = conn.execute(sa.select(requests.c.lane_reason, requests.c.lane_base_attempts).where(requests.c.custom_id.in_(["r2", "r3"])))
        assert set(rows) == {(None, 1)}


def test_a_direct_tier_keeps_exactly_what_it_can_still_do(store):
    _history(store, "echo", "direct", 30)  # 30 s a request: 1000 s left fit 33
    clock = ManualClock(END - 1000)
    full = _job(store, "full", {"tier1": 33})
    assert tiers.step(store, full, KINDS, clock) == 0
    over = _job(store, "over", {"tier1": 34})
    assert tiers.step(store, over, KINDS, clock) == 1
    placed = _lanes(store, over)
    assert [placed[f"r{i}"] for i in range(34)] == ["tier1"] * 33 + ["tier2"]  # the oldest stay


def test_what_a_batch_tier_passes_up_is_counted_by_the_direct_tier_it_lands_on_in_the_same_pass(store):
    _history(store, "echo-batch", "batch", 40 * 60)  # a batch's p95 40 min: 30 min left do not fit it
    _history(store, "echo", "direct", 30)  # 30 s a request: 30 min left fit 60
    job = _job(store, "j", {"main": 100})
    assert tiers.step(store, job, KINDS, ManualClock(END - 1800)) == 140  # 100 up to tier1, 40 of them on to tier2
    placed = _lanes(store, job)
    assert [placed[f"r{i}"] for i in range(100)] == ["tier1"] * 60 + ["tier2"] * 40
    with store.begin() as conn:
        moves = list(conn.scalars(sa.select(events.c.message).where(events.c.kind == "tier_move").order_by(events.c.id)))
    assert [m.split(":")[0] for m in moves] == ["100 request(s) echo-batch → echo", "40 request(s) echo → echo"]
    assert "40 request(s) beyond the 60 its p95 (30 s a request) fits in the 30 min left" in moves[1]
