"""A direct dispatch's claim is bounded by payload size as well as by the route's
dispatch_size (issue 32): the claimed requests are held parsed while the route runs them, so
5,000 prompts of 40 kB must not be taken at once. A claim always takes at least one request,
so a single request bigger than the bound still runs.

What a claim took is read back from the store (each dispatch's size, and the payloads of the
requests that have an attempt from it), on a real SQLite file and on PostgreSQL."""

from __future__ import annotations

import sqlalchemy as sa

from lowtide.core.states import DispatchState
from lowtide.engine import direct
from lowtide.engine.dispatch import claim_due, dispatched_requests, new_dispatch
from lowtide.engine.loader import load_job
from lowtide.store.payloads import payload_chars
from lowtide.store.schema import attempts, dispatches, jobs, requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv

BODY = 10_000  # characters of ticket text per row
BOUND = 50_000  # the claim bound the tests set: four such rows fit, five do not


def _big_rows(n: int) -> list[dict]:
    return [{**row, "body": row["body"].ljust(BODY, "x")} for row in ticket_rows(n)]


def test_a_claim_of_big_payloads_holds_at_most_the_bound(store, clock, tmp_path, monkeypatch):
    monkeypatch.setattr(direct, "CLAIM_BYTES", BOUND)
    source = write_csv(tmp_path / "big.csv", _big_rows(18))
    status = drive_to_end(store, make_spec(source), clock)
    assert status.done

    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).where(requests.c.state != "succeeded")).scalar() == 0
        held = conn.execute(
            sa.select(dispatches.c.id, dispatches.c.size, sa.func.count(), sa.func.sum(payload_chars()))
            .join(attempts, attempts.c.dispatch_id == dispatches.c.id)
            .join(requests, requests.c.id == attempts.c.request_id)
            .where(dispatches.c.kind == "direct")
            .group_by(dispatches.c.id, dispatches.c.size)
        ).all()
    assert sum(size for _, size, _, _ in held) == 18  # each request claimed once, none lost
    for dispatch_id, size, tried, chars in held:
        assert size == tried, f"dispatch {dispatch_id}: size {size}, attempts {tried}"
        assert 1 <= size <= BOUND // BODY, f"dispatch {dispatch_id} claimed {size} requests"
        assert chars <= BOUND, f"dispatch {dispatch_id} held {chars} characters of payload"
    assert len(held) >= 18 * BODY // BOUND  # the bound, not the route's 5,000, split the work


def _claim(store, clock, limit: int, max_bytes: int | None) -> tuple[int, list]:
    with store.begin() as conn:
        job_id = conn.execute(sa.select(jobs.c.id)).scalar_one()
        dispatch_id = new_dispatch(conn, job_id, "echo", "direct", DispatchState.RUNNING, clock.now())
        moved = claim_due(conn, dispatch_id, job_id, clock.now(), limit, "echo", None, max_bytes)
        return moved, dispatched_requests(conn, dispatch_id)


def test_a_request_bigger_than_the_bound_is_claimed_alone_and_the_count_still_bounds(store, clock, tmp_path):
    load_job(store, make_spec(write_csv(tmp_path / "big.csv", _big_rows(6))), clock)

    moved, held = _claim(store, clock, 5000, BODY // 2)  # no row fits: the first goes alone
    assert moved == len(held) == 1
    moved, held = _claim(store, clock, 5000, 2 * BODY + BODY // 2)  # two fit, the third does not
    assert moved == len(held) == 2
    moved, held = _claim(store, clock, 2, 10 * BODY)  # the bytes allow more, the count does not
    assert moved == len(held) == 2
    moved, held = _claim(store, clock, 5000, None)  # no byte bound: every due request
    assert moved == len(held) == 1
    claimed = [r.custom_id for r in held]
    assert claimed == ["T1005"]  # oldest first, as before


def test_small_payloads_are_summed_at_once_and_a_big_one_past_the_first_few_still_ends_the_claim(store, clock, tmp_path):
    rows = ticket_rows(40)
    rows[36]["body"] = rows[36]["body"].ljust(20_000, "x")  # the 17th of the second claim
    load_job(store, make_spec(write_csv(tmp_path / "mixed.csv", rows)), clock)

    claims = [[r.custom_id for r in _claim(store, clock, 20, 20_000)[1]] for _ in range(4)]
    assert claims == [
        [f"T{1000 + i}" for i in range(20)],  # small ones: the count ends the claim
        [f"T{1000 + i}" for i in range(20, 36)],  # the big one does not fit beside them
        ["T1036"],  # over the bound alone: claimed alone
        ["T1037", "T1038", "T1039"],
    ]
