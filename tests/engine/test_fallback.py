"""Per-item fallback and the deadline cut-over, on both stores.

The main route is `echo-batch` (a provider simulation whose work advances with polls and
whose cancel delivers what was done); the fallback route is `echo`.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import sqlalchemy as sa

from lowtide.core.states import DispatchState
from lowtide.engine.control import job_status, retry_job
from lowtide.engine.fallback import expected_turnaround
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.schema import attempts, dispatches, requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv

HOUR = 3600.0


def _spec(
    tmp_path, rows: int = 10, deadline_in: float | None = None, clock=None, fallback: dict | None = None,
    chunk_size: int | None = None, **options,
):  # fmt: skip
    source = write_csv(tmp_path / "t.csv", ticket_rows(rows))
    extra = {"chunk_size": chunk_size}
    if deadline_in is not None:
        extra["deadline"] = datetime.fromtimestamp(clock.now() + deadline_in, UTC).isoformat()
    return make_spec(
        source,
        route="echo-batch",
        route_options={"dir": str(tmp_path / "provider"), **options},
        retry={"max_attempts": 2, "backoff_seconds": 1},
        fallback={"route": "echo", **(fallback or {})},
        **extra,
    )


def _placement(store) -> dict[str, tuple[str, str | None, str]]:
    """custom_id -> (route that answered, why it moved lanes, state)."""
    with store.begin() as conn:
        rows = conn.execute(sa.select(requests.c.custom_id, requests.c.route, requests.c.lane_reason, requests.c.state))
        return {cid: (route, why, state) for cid, route, why, state in rows}


def _applied_attempts(store) -> dict[str, list[tuple[str, bool]]]:
    """custom_id -> [(route, applied)] of its successful attempts."""
    out: dict[str, list[tuple[str, bool]]] = {}
    with store.begin() as conn:
        rows = conn.execute(
            sa.select(requests.c.custom_id, attempts.c.route, attempts.c.applied)
            .join(attempts, attempts.c.request_id == requests.c.id)
            .where(attempts.c.ok)
        )
        for cid, route, applied in rows:
            out.setdefault(cid, []).append((route, applied))
    return out


def test_requests_that_exhaust_their_retries_go_to_the_fallback_route(store, clock, tmp_path):
    spec = _spec(tmp_path, fail_attempts={"T1001": 99})
    status = drive_to_end(store, spec, clock)
    assert status.counts == {"succeeded": 10}
    placed = _placement(store)
    assert placed["T1001"] == ("echo", "failed 2 time(s), last: server_error on echo-batch", "succeeded")
    assert {cid: p[0] for cid, p in placed.items() if cid != "T1001"} == {f"T{1000 + i}": "echo-batch" for i in range(10) if i != 1}
    with store.begin() as conn:
        tries = conn.execute(sa.select(requests.c.attempts).where(requests.c.custom_id == "T1001")).scalar_one()
    assert tries == 3  # two on the batch route, one on the fallback


def test_expired_requests_go_to_the_fallback_route_at_once(store, clock, tmp_path):
    spec = _spec(tmp_path, drop=["T1002"])  # the provider's output leaves it out: expired
    drive_to_end(store, spec, clock)
    assert _placement(store)["T1002"] == ("echo", "expired on echo-batch", "succeeded")
    with store.begin() as conn:
        tries = conn.execute(sa.select(requests.c.attempts).where(requests.c.custom_id == "T1002")).scalar_one()
    assert tries == 2  # no second batch attempt first


def test_a_request_failing_on_the_fallback_too_fails_with_its_retries_counted_there(store, clock, tmp_path):
    spec = _spec(tmp_path, drop=["T1003"], fallback={"route_options": {"reject": ["T1003"]}})
    status = drive_to_end(store, spec, clock)
    assert status.counts == {"succeeded": 9, "failed": 1}
    assert _placement(store)["T1003"] == ("echo", "expired on echo-batch", "failed")


def test_the_fallback_model_replaces_the_jobs_model_on_the_fallback_route(store, clock, tmp_path):
    seen: list[str] = []
    from lowtide.routes.own.echo import EchoRoute

    class Spy(EchoRoute):
        async def execute(self, batch):
            seen.extend(r.model for r in batch)
            async for o in super().execute(batch):
                yield o

    spec = _spec(tmp_path, drop=["T1004"], fallback={"model": "small-model"})
    drive_to_end(store, spec, clock, engine=Engine(store, clock, seed=1, routes={"echo": Spy({})}))
    assert seen == ["small-model"]


def _tick_until(engine, store, clock, done, step: float = 1.0, ticks: int = 200):
    async def go():
        for _ in range(ticks):
            await engine.tick("tickets")
            if done():
                return
            clock.advance(step)
        raise AssertionError("the condition was not reached")

    asyncio.run(go())


def _dispatch_rows(store):
    with store.begin() as conn:
        return conn.execute(
            sa.select(dispatches.c.route, dispatches.c.state, dispatches.c.phase, dispatches.c.cut_at).order_by(dispatches.c.id)
        ).all()


def test_at_the_cut_over_a_batch_is_cancelled_its_results_kept_and_the_rest_sent_to_the_fallback(store, clock, tmp_path):
    # 10 requests; the batch does a tenth of them per poll; deadline in 2 h, margin 15 min.
    spec = _spec(tmp_path, deadline_in=2 * HOUR, clock=clock, polls_to_complete=10, fallback={"expected_turnaround": 600})
    load_job(store, spec, clock)
    engine = Engine(store, clock, seed=3)
    cut_at = spec.deadline.timestamp() - spec.fallback.safety_margin

    async def run():
        await engine.tick("tickets")  # plan + submit
        for _ in range(3):  # three polls: three requests done at the provider
            clock.advance(10)
            await engine.tick("tickets")
        clock.advance(cut_at - clock.now())
        for _ in range(3):
            await engine.tick("tickets")  # cut: cancel, the batch ends, ingest, the rest on echo
            clock.advance(1)
        await engine.aclose()

    asyncio.run(run())
    assert job_status(store, "tickets").counts == {"succeeded": 10}
    placed = _placement(store)
    by_batch = sorted(c for c, p in placed.items() if p[0] == "echo-batch")
    by_fallback = sorted(c for c, p in placed.items() if p[0] == "echo")
    assert len(by_batch) == 5  # 3 polls before the cut, the one that found it running, the one after the cancel
    assert len(by_fallback) == 5
    assert {placed[c][1] for c in by_fallback} == {"batch_cancelled on echo-batch"}
    # Nothing paid for twice: one successful attempt per request, on the route that answered.
    assert {c: a for c, a in _applied_attempts(store).items()} == {c: [(placed[c][0], True)] for c in placed}
    [(route, state, phase, cut)] = _dispatch_rows(store)[:1]
    assert (route, state, cut) == ("echo-batch", DispatchState.ENDED, cut_at)


def test_a_batch_that_does_not_end_after_its_cancel_is_left_behind_and_its_late_results_are_never_applied(
    store, clock, tmp_path
):
    spec = _spec(
        tmp_path, deadline_in=2 * HOUR, clock=clock, polls_to_complete=10, cancel_polls=1000,
        fallback={"expected_turnaround": 600, "safety_margin": 900},
    )  # fmt: skip
    load_job(store, spec, clock)
    engine = Engine(store, clock, seed=3)
    cut_at = spec.deadline.timestamp() - 900

    async def run():
        await engine.tick("tickets")
        clock.advance(cut_at - clock.now())
        await engine.tick("tickets")  # cancel asked; the provider keeps working
        clock.advance(299)
        await engine.tick("tickets")  # within a third of the margin: still waiting
        assert {p[0] for p in _placement(store).values()} == {"echo-batch"}
        clock.advance(2)
        await engine.tick("tickets")  # past it: released to echo and answered there
        await engine.tick("tickets")

    asyncio.run(run())
    placed = _placement(store)
    assert {p[0] for p in placed.values()} == {"echo"}
    assert {p[1] for p in placed.values()} == {"its batch did not end after being cancelled at the cut-over"}

    # The provider finally finishes the cancelled batch, with answers for all ten.
    provider = engine.route_for(engine_lanes(store)[0])
    provider.cancel_polls = 0
    provider.polls_to_complete = 1
    clock.advance(10)  # the next poll is due
    asyncio.run(engine.tick("tickets"))
    asyncio.run(engine.aclose())
    late = _applied_attempts(store)
    assert all(sorted(a) == [("echo", True), ("echo-batch", False)] for a in late.values()), late
    with store.begin() as conn:
        outputs = set(conn.execute(sa.select(requests.c.route)).scalars())
        stale_tokens = conn.execute(
            sa.select(sa.func.sum(attempts.c.input_tokens)).where(attempts.c.applied.is_(False))
        ).scalar_one()
    assert outputs == {"echo"} and stale_tokens > 0  # recorded with its usage, never applied
    assert job_status(store, "tickets").counts == {"succeeded": 10}


def engine_lanes(store):
    from lowtide.engine.context import JobContext
    from lowtide.store.schema import jobs

    with store.begin() as conn:
        return JobContext.from_row(conn.execute(sa.select(jobs)).one()).lanes


def test_a_batch_that_cannot_finish_before_the_cut_over_is_never_sent(store, clock, tmp_path):
    spec = _spec(tmp_path, deadline_in=HOUR, clock=clock)  # turnaround 1 h by default > 45 min left
    status = drive_to_end(store, spec, clock)
    assert status.counts == {"succeeded": 10}
    assert _dispatch_rows(store)[0].route == "echo"  # no batch at all
    reasons = {p[1] for p in _placement(store).values()}
    assert reasons == {"batches on echo-batch are expected to take 3600 s; 2700 s were left before the cut-over"}


def test_turnaround_is_learned_from_this_stores_batches(store, clock, tmp_path):
    spec = _spec(tmp_path, rows=30, chunk_size=10, polls_to_complete=2)
    drive_to_end(store, spec, clock, step=120.0)
    with store.begin() as conn:
        took = sorted(conn.execute(sa.select(dispatches.c.ended_at - dispatches.c.submitted_at)).scalars())
        assert len(took) == 3
        assert expected_turnaround(conn, "echo-batch", 99999.0) == took[1]
        assert expected_turnaround(conn, "openai-batch", 99999.0) == 99999.0


def test_status_says_where_each_request_ran_and_why(store, clock, tmp_path):
    spec = _spec(tmp_path, drop=["T1002", "T1005"])
    drive_to_end(store, spec, clock)
    where = job_status(store, "tickets").placement
    assert where == [("echo", "expired on echo-batch", "succeeded", 2), ("echo-batch", None, "succeeded", 8)]


def test_retry_of_failed_requests_starts_them_again_on_the_main_route(store, clock, tmp_path):
    spec = _spec(tmp_path, drop=["T1003"], fallback={"route_options": {"reject": ["T1003"]}})
    drive_to_end(store, spec, clock)
    assert retry_job(store, "tickets", clock) == 1
    assert _placement(store)["T1003"] == ("echo", None, "pending")
    with store.begin() as conn:
        lane = conn.execute(sa.select(requests.c.lane).where(requests.c.custom_id == "T1003")).scalar_one()
    assert lane == "main"


def test_a_scalable_fallback_route_is_told_how_much_must_finish_by_the_deadline(store, clock, tmp_path):
    from lowtide.routes.own.echo import EchoRoute

    class Scalable(EchoRoute):
        asked: list[tuple[int, float]] = []

        def plan_for(self, count: int, seconds: float) -> None:
            self.asked.append((count, seconds))

    spec = _spec(tmp_path, deadline_in=HOUR, clock=clock)  # too close for a batch: all go to echo
    load_job(store, spec, clock)
    route = Scalable({})

    async def run():
        async with Engine(store, clock, routes={"echo": route}) as engine:
            await engine.tick("tickets")

    asyncio.run(run())
    assert route.asked == [(10, HOUR)]
    assert job_status(store, "tickets").counts == {"succeeded": 10}
