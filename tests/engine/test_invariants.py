"""DESIGN.md's invariants, each pinned by a test that fails if it breaks."""

from __future__ import annotations

import asyncio
import random

import sqlalchemy as sa

from lowtide.core.states import TERMINAL_REQUEST_STATES, JobState, RequestState
from lowtide.core.types import Outcome, Usage
from lowtide.engine.context import JobContext
from lowtide.engine.ingest import apply_outcomes
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.routes.own.echo import EchoRoute
from lowtide.routes.own.echo_batch import EchoBatchRoute
from lowtide.store.db import Store
from lowtide.store.queries import get_job
from lowtide.store.schema import attempts, dispatches, requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, whole_columns, write_csv


class StoreProbe:
    """Wraps a route; before anything is handed to it, checks in a separate connection
    that every request is already committed to the store in its dispatch."""

    def __init__(self, inner, store_location: str):
        self.inner = inner
        self.kind = inner.kind
        self.name = inner.name
        self.location = store_location
        self.checked = 0
        for attr in ("dispatch_size", "limits", "poll_interval"):
            if hasattr(inner, attr):
                setattr(self, attr, getattr(inner, attr))

    def check_model(self, model):
        self.inner.check_model(model)

    def _assert_stored(self, batch, dispatch_states):
        # Another connection: it sees only committed rows.
        with Store(self.location) as other, other.begin() as conn:
            rows = conn.execute(
                sa.select(requests.c.custom_id, requests.c.state, dispatches.c.state)
                .join(dispatches, dispatches.c.id == requests.c.dispatch_id)
                .where(requests.c.custom_id.in_([r.custom_id for r in batch]))
            ).all()
        assert len(rows) == len(batch)
        for _cid, state, dispatch_state in rows:
            assert state == RequestState.DISPATCHED
            assert dispatch_state in dispatch_states
        self.checked += len(batch)

    async def execute(self, batch):
        self._assert_stored(batch, {"running"})
        async for outcome in self.inner.execute(batch):
            yield outcome

    async def submit(self, key, batch):
        batch = list(batch)
        self._assert_stored(batch, {"submitting"})
        return await self.inner.submit(key, batch)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_1_nothing_reaches_a_route_before_it_is_in_the_store(sqlite_store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(30))
    direct = StoreProbe(EchoRoute({"dispatch_size": 7}), sqlite_store.location)
    drive_to_end(sqlite_store, make_spec(source), clock, engine=Engine(sqlite_store, clock, routes={"echo": direct}))
    assert direct.checked == 30

    batch = StoreProbe(EchoBatchRoute({"dir": str(tmp_path / "p"), "max_requests": 8}), sqlite_store.location)
    other = write_csv(tmp_path / "u.csv", ticket_rows(30, start=2000))
    spec = make_spec(other, name="batched", route="echo-batch")
    drive_to_end(sqlite_store, spec, clock, engine=Engine(sqlite_store, clock, routes={"echo-batch": batch}))
    assert batch.checked == 30


def _job(store, name="tickets") -> JobContext:
    with store.begin() as conn:
        return JobContext.from_row(get_job(conn, name))


def test_2_a_result_is_applied_at_most_once_and_stale_results_never_overwrite(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    spec = make_spec(source, route="echo-batch", route_options={"dir": str(tmp_path / "p"), "drop": ["T1000"]})
    drive_to_end(store, spec, clock)
    # T1000 was missing from its first batch's output, so it was retried in a second batch.
    with store.begin() as conn:
        req = conn.execute(sa.select(*whole_columns(requests)).where(requests.c.custom_id == "T1000")).one()
        first_dispatch = conn.execute(
            sa.select(sa.func.min(attempts.c.dispatch_id)).where(attempts.c.request_id == req.id)
        ).scalar_one()
    assert req.state == RequestState.FAILED  # dropped every time: it expired 3 times
    assert req.attempts == 3

    # Now a late result for it arrives from the first batch: recorded, never applied.
    job = _job(store)
    late = Outcome("T1000", True, text="late answer", usage=Usage(input_tokens=5, output_tokens=2))
    with store.begin() as conn:
        # The first batch already has an attempt for it (the synthetic expiry): ingesting the
        # same batch again is a no-op.
        counts = apply_outcomes(conn, job, first_dispatch, "echo-batch", [late], clock.now(), random.Random(1))
    assert counts.succeeded == 0 and counts.stale == 0
    # From a batch the request has left (a dispatch it never had an attempt in): stale.
    with store.begin() as conn:
        other = conn.execute(sa.select(sa.func.max(dispatches.c.id))).scalar_one() + 100
        counts = apply_outcomes(conn, job, other, "echo-batch", [late, late], clock.now(), random.Random(1))
        after = conn.execute(sa.select(*whole_columns(requests)).where(requests.c.custom_id == "T1000")).one()
        stale = conn.execute(
            sa.select(attempts.c.applied, attempts.c.input_tokens).where(attempts.c.dispatch_id == other)
        ).all()
    assert counts.stale == 1  # the duplicate line in the same delivery is not recorded twice
    assert after.state == RequestState.FAILED and after.output != "late answer"
    assert stale == [(False, 5)]  # kept with its usage, for the ledger


def test_2_a_succeeded_request_is_never_overwritten_by_a_second_result(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(2))
    drive_to_end(store, make_spec(source), clock)
    job = _job(store)
    with store.begin() as conn:
        req = conn.execute(sa.select(*whole_columns(requests)).where(requests.c.custom_id == "T1000")).one()
        counts = apply_outcomes(
            conn, job, req.dispatch_id + 1, "echo", [Outcome("T1000", True, text="other")], clock.now(), random.Random(1)
        )
        again = conn.execute(sa.select(requests.c.output).where(requests.c.id == req.id)).scalar_one()
    assert counts.stale == 1
    assert again == req.output


def test_4_every_request_ends_in_exactly_one_terminal_state(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(20))
    spec = make_spec(
        source,
        route_options={"reject": ["T1003"], "fail_attempts": {"T1004": 1, "T1005": 5}},
    )
    status = drive_to_end(store, spec, clock)
    assert status.state == JobState.FINISHED
    with store.begin() as conn:
        rows = dict(conn.execute(sa.select(requests.c.custom_id, requests.c.state)).all())
        reasons = dict(conn.execute(sa.select(requests.c.custom_id, requests.c.error_code)).all())
    assert set(rows.values()) <= TERMINAL_REQUEST_STATES
    assert len(rows) == 20
    assert rows["T1003"] == "failed" and reasons["T1003"] == "invalid_request"
    assert rows["T1004"] == "succeeded"  # failed once, retried, succeeded
    assert rows["T1005"] == "failed" and reasons["T1005"] == "server_error"  # out of attempts


def test_5_results_are_matched_by_custom_id_not_order(store, clock, tmp_path):
    # echo-batch returns results in reverse order; the direct path too is checked by content.
    source = write_csv(tmp_path / "t.csv", ticket_rows(15))
    spec = make_spec(source, route="echo-batch", route_options={"dir": str(tmp_path / "p")})
    drive_to_end(store, spec, clock)
    with store.begin() as conn:
        for cid, output in conn.execute(sa.select(requests.c.custom_id, requests.c.output)):
            number = cid.removeprefix("T")
            assert output.startswith(f"Ticket: ticket {number} ")


def test_retryable_failures_wait_for_their_backoff_on_the_engine_clock(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(1))
    spec = make_spec(source, route_options={"fail_attempts": {"T1000": 1}}, retry={"backoff_seconds": 100})
    load_job(store, spec, clock)

    async def go():
        async with Engine(store, clock, seed=1) as engine:
            await engine.tick()
            with store.begin() as conn:
                first = conn.execute(sa.select(requests.c.state, requests.c.not_before)).one()
            assert first.state == "pending"
            assert clock.now() + 50 <= first.not_before <= clock.now() + 100  # jittered backoff
            await engine.tick()  # not due yet: nothing happens
            with store.begin() as conn:
                assert conn.execute(sa.select(requests.c.attempts)).scalar_one() == 1
            clock.advance(101)
            await engine.tick()
            with store.begin() as conn:
                return conn.execute(sa.select(requests.c.state, requests.c.attempts)).one()

    assert tuple(asyncio.run(go())) == ("succeeded", 2)
