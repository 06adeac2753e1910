"""`route: auto` across a chain of tiers, chosen per chunk, on both stores.

The chain is echo-batch (lowtide's batch simulation: its work advances with polls, a cancel
delivers what was done; free, so the cheapest), then openai flex, then openai real time,
both against a real HTTP server on loopback that answers at the tier it is asked for
(tests/routes/upstream.py), priced from a price file. echo-batch's turnaround is measured
from three earlier batches in the store (20, 30 and 38 minutes): p95 38 min.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from lowtide.core.pricing import PRICES_ENV
from lowtide.core.spec import JobSpec
from lowtide.engine.control import job_status
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.schema import attempts, dispatches, events, jobs, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.upstream import Reply, Upstream

MODEL = "team-model"
PRICES = """\
openai:
  team-model:
    realtime: {input: 1.0, output: 4.0}
    batch: {input: 0.5, output: 2.0}
    flex: {input: 0.6, output: 2.4}
"""
HOUR = 3600.0
MINUTE = 60.0


@pytest.fixture
def upstream():
    with Upstream() as server:
        yield server


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789abcdef")
    (tmp_path / "prices.yaml").write_text(PRICES)
    monkeypatch.setenv(PRICES_ENV, str(tmp_path / "prices.yaml"))


def _candidates(tmp_path, upstream, **batch_options):
    wire = {"base_url": f"{upstream.url}/v1", "max_retries": 0}  # a 429 comes back as a retryable outcome
    return [
        {"route": "echo-batch", "route_options": {"dir": str(tmp_path / "provider"), **batch_options}},
        {"route": "openai", "route_options": {"service_tier": "flex", **wire}},
        {"route": "openai", "route_options": wire},
    ]


def _spec(tmp_path, upstream, rows: int, max_wait="2h", **batch_options) -> JobSpec:
    source = write_csv(tmp_path / "t.csv", ticket_rows(rows))
    return make_spec(
        source, model=MODEL, route="auto", retry={"max_attempts": 3, "backoff_seconds": 600},
        auto={"max_wait": max_wait, "candidates": _candidates(tmp_path, upstream, **batch_options)},
    )  # fmt: skip


def _batch_history(store, minutes=(20, 30, 38)) -> None:
    """Earlier echo-batch batches of the model, as the store keeps them: its measured turnaround."""
    with store.begin() as conn:
        job_id = conn.execute(
            sa.insert(jobs).values(name="earlier", spec="{}", route="echo-batch", state="finished", created_at=0, updated_at=0)
        ).inserted_primary_key[0]
        for i, m in enumerate(minutes):
            conn.execute(sa.insert(dispatches).values(
                job_id=job_id, route="echo-batch", kind="batch", key=f"earlier-{i}", state="ended", size=10, polls=1,
                cancel_requested=False, created_at=0, submitted_at=1000, ended_at=1000 + m * MINUTE, model=MODEL,
            ))  # fmt: skip


def _stored(store) -> JobSpec:
    with store.begin() as conn:
        return JobSpec.model_validate_json(conn.execute(sa.select(jobs.c.spec).where(jobs.c.name == "tickets")).scalar_one())


def _requests(store) -> dict[str, tuple[str, str, str | None, str | None]]:
    """custom_id -> (state, lane, route that answered, why it moved)."""
    with store.begin() as conn:
        rows = conn.execute(
            sa.select(requests.c.custom_id, requests.c.state, requests.c.lane, requests.c.route, requests.c.lane_reason)
            .join(jobs, jobs.c.id == requests.c.job_id).where(jobs.c.name == "tickets")
        )  # fmt: skip
        return {cid: (state, lane, route, why) for cid, state, lane, route, why in rows}


def _attempts(store) -> list[tuple[str, str, str | None, bool, bool, int | None]]:
    """(custom_id, route, tier, ok, applied, cost in picodollars) of every attempt."""
    with store.begin() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.select(requests.c.custom_id, attempts.c.route, attempts.c.tier, attempts.c.ok, attempts.c.applied,
                          attempts.c.cost_picousd)
                .join(requests, requests.c.id == attempts.c.request_id)
            )  # fmt: skip
        ]


def _events(store, kind: str) -> list[str]:
    with store.begin() as conn:
        return list(conn.scalars(sa.select(events.c.message).where(events.c.kind == kind).order_by(events.c.id)))


def _key(cid: str) -> str:
    """What the loopback server tells a request by: its last user message."""
    n = int(cid[1:]) - 1000
    return f"Ticket: ticket {cid[1:]} about {['billing', 'technical', 'account', 'shipping', 'feedback'][n % 5]}"


def test_three_candidates_become_a_chain_with_each_tier_taking_over_its_p95_before_the_end(store, clock, tmp_path, upstream):
    _batch_history(store)
    load_job(store, _spec(tmp_path, upstream, 20), clock)
    spec = _stored(store)
    assert (spec.route, spec.fallback) == ("echo-batch", None)
    assert [t.label for t in spec.auto.chain] == ["echo-batch", "openai (flex)", "openai"]
    # flex: 10 s a request (prior) x 20; real time: 2 s x 20 = 40 s, at least a minute
    assert [t.margin for t in spec.auto.chain] == [0, 200, 60]
    assert spec.deadline.timestamp() == clock.now() + 2 * HOUR
    [choice] = _events(store, "route_choice")
    assert choice.startswith("echo-batch: p95 38 min fits 2 h (measured: 3 batches), $0 vs openai (flex) $")
    assert choice.endswith("; openai (flex), then openai take over, tier by tier, as the end of max_wait nears")


def test_late_chunks_go_to_flex_and_near_the_end_each_tier_hands_over_to_the_next(store, clock, tmp_path, upstream):
    _batch_history(store)
    spec = _spec(tmp_path, upstream, 20, polls_to_complete=10)
    load_job(store, spec, clock)
    end = _stored(store).deadline.timestamp()
    # Late requests T1037..T1039 are refused twice on flex (429): they wait for a retry
    # past flex's own hand-over time.
    for cid in ("T1037", "T1038", "T1039"):
        upstream.plan(_key(cid), Reply(status=429), Reply(status=429))
    engine = Engine(store, clock, seed=5)

    async def ticks(n: int, step: float = 1.0) -> None:
        for _ in range(n):
            await engine.tick("tickets")
            clock.advance(step)

    async def run() -> None:
        await ticks(3, 10)  # plan, submit and poll the first 20 as one batch on echo-batch
        # 30 min before the end: 20 more rows come in; a batch's p95 (38 min) no longer fits.
        clock.advance(end - 30 * MINUTE - clock.now())
        write_csv(tmp_path / "t.csv", ticket_rows(40))
        load_job(store, spec, clock)
        await ticks(1)
        placed = _requests(store)
        assert {c for c, p in placed.items() if p[1] == "tier1"} == {f"T{i}" for i in range(1020, 1040)}
        assert placed["T1020"][3] == (
            "openai (flex): p95 3 min fits the 30 min left; echo-batch: p95 38 min does not fit the 30 min left"
        )
        # echo-batch hands over 200 s (flex's p95 for the job) before the end: its batch is
        # cancelled, what it finished is kept, the rest goes to flex.
        clock.advance(end - 200 - clock.now())
        await ticks(4)
        placed = _requests(store)
        assert {p[0] for p in placed.values()} <= {"succeeded", "pending"}
        assert {c for c, p in placed.items() if p[0] == "pending"} == {"T1037", "T1038", "T1039"}
        # flex hands over 60 s before the end: its unfinished work goes to real time.
        clock.advance(end - 60 - clock.now())
        await ticks(2)
        await engine.aclose()

    asyncio.run(run())
    assert job_status(store, "tickets").counts == {"succeeded": 40}
    placed = _requests(store)
    on_batch = {c for c, p in placed.items() if p[2] == "echo-batch"}
    cancelled_up = {c for c, p in placed.items() if p[3] == "batch_cancelled on echo-batch"}
    assert on_batch and cancelled_up and on_batch | cancelled_up == {f"T{i}" for i in range(1000, 1020)}
    assert all(placed[c][1:3] == ("tier1", "openai") for c in cancelled_up)
    assert {c for c, p in placed.items() if p[1] == "tier2"} == {"T1037", "T1038", "T1039"}
    assert placed["T1037"][3] == "openai: p95 6 s fits the 60 s left; openai (flex) hands over 60 s before the end of max_wait"

    # Nothing lost or done twice: one applied answer per request, on the tier it ended on;
    # every attempt recorded at its tier and priced there.
    tries = _attempts(store)
    applied = {}
    for cid, _, tier, ok, was_applied, _ in tries:
        if ok and was_applied:
            assert cid not in applied, f"{cid} answered twice"
            applied[cid] = tier
    expected_tier = {c: {"main": "free", "tier1": "flex", "tier2": "realtime"}[p[1]] for c, p in placed.items()}
    assert applied == expected_tier
    failed = {tier: sorted(cid for cid, _, t, ok, _, _ in tries if not ok and t == tier) for tier in ("free", "flex", "realtime")}
    # cancelled with the batch; each scripted 429 on flex (the first, and its retry 10 min later)
    assert failed == {"free": sorted(cancelled_up), "flex": ["T1037", "T1037", "T1038", "T1038", "T1039", "T1039"], "realtime": []}
    cost = {tier: {c for _, _, t, _, _, c in tries if t == tier} for tier in ("free", "flex", "realtime")}
    assert cost["free"] == {0}
    [flex], [realtime] = cost["flex"] - {0}, cost["realtime"]  # same usage each: one price per tier
    assert realtime == flex / 0.6  # the price file: flex is 60% of real time, for input and output alike
    seen_ok = [s.key for s in upstream.seen if s.status == 200]
    assert len(seen_ok) == len(set(seen_ok)) == 20 + len(cancelled_up)  # no request answered twice upstream
    moves = _events(store, "tier_move")
    assert any(m.startswith("20 request(s) echo-batch → openai (flex): ") and "(echo-batch measured: 3 batches" in m for m in moves)
    assert any(m.startswith("3 request(s) openai (flex) → openai: ") for m in moves)
    assert any(m.startswith("echo-batch: 1 batch(es) asked to cancel") for m in _events(store, "cut_over"))
    # status: requests by tier
    assert job_status(store, "tickets").tiers == [
        ("echo-batch", "succeeded", len(on_batch)),
        ("openai (flex)", "succeeded", 40 - len(on_batch) - 3),
        ("openai", "succeeded", 3),
    ]


def _rows_arrive_late(store, clock, tmp_path, upstream, left: float, rows: int) -> dict:
    """A 20-row job ticks four times; then, `left` seconds before the end of max_wait, the
    source has grown to `rows` rows and is loaded again and ticked once. The requests placed."""
    _batch_history(store)
    spec = _spec(tmp_path, upstream, 20)
    load_job(store, spec, clock)
    end = _stored(store).deadline.timestamp()
    engine = Engine(store, clock, seed=5)

    async def run() -> None:
        for _ in range(4):
            await engine.tick("tickets")
            clock.advance(10)
        clock.advance(end - left - clock.now())
        write_csv(tmp_path / "t.csv", ticket_rows(rows))
        load_job(store, spec, clock)
        await engine.tick("tickets")
        await engine.aclose()

    asyncio.run(run())
    return _requests(store)


def test_work_arriving_after_a_tiers_hand_over_skips_the_tiers_that_can_no_longer_make_it(store, clock, tmp_path, upstream):
    # After both echo-batch's (200 s) and flex's (60 s) hand-over: straight to real time.
    placed = _rows_arrive_late(store, clock, tmp_path, upstream, left=50, rows=25)
    late = {f"T{i}" for i in range(1020, 1025)}
    assert {c for c, p in placed.items() if p[1] == "tier2"} == late
    assert all(placed[c][0] == "succeeded" and placed[c][2] == "openai" for c in late)
    assert placed["T1020"][3] == (
        "openai: p95 10 s fits the 50 s left; echo-batch hands over 3 min before the end of max_wait; openai (flex) handed over"
    )


def test_a_direct_tier_keeps_what_it_can_still_do_and_passes_on_the_rest(store, clock, tmp_path, upstream):
    # 150 s left, after echo-batch's hand-over: flex (10 s a request) can do 15 of 20.
    placed = _rows_arrive_late(store, clock, tmp_path, upstream, left=150, rows=40)
    late = [f"T{i}" for i in range(1020, 1040)]
    assert [placed[c][1] for c in late] == ["tier1"] * 15 + ["tier2"] * 5  # the oldest stay
    assert placed["T1035"][3] == (
        "openai: p95 10 s fits the 2 min left; "
        "openai (flex): 5 request(s) beyond the 15 its p95 (10 s a request) fits in the 2 min left"
    )
    assert {placed[c][0] for c in late} == {"succeeded"}


def test_an_auto_job_with_its_own_fallback_keeps_two_lanes(store, clock, tmp_path, upstream):
    source = write_csv(tmp_path / "t.csv", ticket_rows(10))
    spec = make_spec(
        source, model=MODEL, route="auto", fallback={"route": "echo"},
        auto={"max_wait": "2h", "candidates": _candidates(tmp_path, upstream)},
    )  # fmt: skip
    _batch_history(store)
    load_job(store, spec, clock)
    stored = _stored(store)
    assert stored.route == "echo-batch" and stored.auto.chain is None and stored.chain is None
    assert stored.fallback.route == "echo" and stored.deadline is None  # as before: max_wait fails nobody


def test_a_store_with_lanes_from_before_still_runs(store, clock, tmp_path):
    """A job decided by an earlier lowtide: its next tier up kept as `fallback`, requests on
    lanes main and fallback. It runs on its two lanes as it always did."""
    source = write_csv(tmp_path / "t.csv", ticket_rows(6))
    deadline = datetime.fromtimestamp(clock.now() + 2 * HOUR, UTC).isoformat()
    spec = make_spec(
        source, route="echo-batch", route_options={"dir": str(tmp_path / "provider")}, deadline=deadline,
        fallback={"route": "echo", "safety_margin": 60, "expected_turnaround": 1},
        auto={"max_wait": "2h", "chosen": "echo-batch", "candidates": [{"route": "echo-batch"}, {"route": "echo"}]},
    )  # fmt: skip
    load_job(store, spec, clock)
    with store.begin() as conn:  # two had moved to the fallback lane before the upgrade
        conn.execute(
            sa.update(requests).where(requests.c.custom_id.in_(["T1000", "T1001"])).values(lane="fallback", lane_reason="expired on echo-batch")
        )
    engine = Engine(store, clock, seed=5)

    async def run() -> None:
        for _ in range(4):
            await engine.tick("tickets")
            clock.advance(10)
        await engine.aclose()

    asyncio.run(run())
    placed = _requests(store)
    assert {c: p[:3] for c, p in placed.items()} == {
        c: ("succeeded", "fallback", "echo") if c in ("T1000", "T1001") else ("succeeded", "main", "echo-batch") for c in placed
    }
    assert job_status(store, "tickets").tiers == []  # no chain: the placement table says where they ran


def test_a_worker_wakes_for_each_hand_over_of_the_chain(store, clock, tmp_path, upstream):
    from lowtide.engine.tick import _cut_over_time

    _batch_history(store)
    load_job(store, _spec(tmp_path, upstream, 20), clock)
    spec = _stored(store)
    end = spec.deadline.timestamp()
    raw = spec.model_dump_json()
    assert _cut_over_time(raw, clock.now()) == end - 200  # echo-batch hands over to flex
    assert _cut_over_time(raw, end - 200) == end - 60  # then flex to real time
    assert _cut_over_time(raw, end - 60) is None


def test_what_a_batch_hands_back_after_the_next_tiers_hand_over_goes_on_up(store, clock, tmp_path, upstream):
    """The worker last ticked well before echo-batch's hand-over and next after flex's: the
    cancelled batch's unfinished requests come back to flex (the next tier) at ingest, and
    flex, past its own hand-over, does not take them: real time does, at the next tick."""
    _batch_history(store)
    load_job(store, _spec(tmp_path, upstream, 20, polls_to_complete=10), clock)
    end = _stored(store).deadline.timestamp()
    engine = Engine(store, clock, seed=5)

    async def run() -> None:
        for _ in range(2):
            await engine.tick("tickets")
            clock.advance(10)
        clock.advance(end - 50 - clock.now())
        for _ in range(4):
            await engine.tick("tickets")
            clock.advance(1)
        await engine.aclose()

    asyncio.run(run())
    placed = _requests(store)
    assert {p[0] for p in placed.values()} == {"succeeded"}
    handed_back = {c for c, p in placed.items() if p[2] != "echo-batch"}
    assert handed_back and all(placed[c][1:3] == ("tier2", "openai") for c in handed_back)
    assert placed[min(handed_back)][3].startswith("openai: p95 ")
    assert "openai (flex) hands over 60 s before the end of max_wait" in placed[min(handed_back)][3]
    assert not [s for s in upstream.seen if s.body.get("service_tier") == "flex"]  # flex was never asked
