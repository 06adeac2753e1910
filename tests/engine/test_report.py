"""`cost_report`: the ledger summed and grouped, checked against sums worked out by hand
(prices of the shipped catalog, USD per million tokens), on both stores."""

from __future__ import annotations

from decimal import Decimal

import pytest
import sqlalchemy as sa

from lowtide.core.errors import JobNotFoundError
from lowtide.core.types import Outcome, Usage
from lowtide.engine.report import cost_report
from lowtide.store.db import Store
from lowtide.store.migrations import MIGRATIONS
from lowtide.store.schema import attempts, migrations
from tests.engine.ledger_helpers import NOW, dispatch, ingest, ok, stored_job

D = Decimal


def _fallback_job(store, tmp_path):
    """openai-batch (gpt-4o-mini) with openai real time (gpt-4o) as its fallback route:
    r0 and r1 answered in the batch, r2 expired there and answered in real time."""
    job = stored_job(
        store, tmp_path, n=3, model="gpt-4o-mini", route="openai-batch", tags=["support", "nightly"],
        fallback={"route": "openai", "model": "gpt-4o"},
    )  # fmt: skip
    batch = dispatch(store, job, "openai-batch", ["r0", "r1", "r2"])
    expired = Outcome("r2", False, usage=Usage(), error_code="expired", error_message="x", retryable=True)
    ingest(store, job, batch, "openai-batch", [
        ok("r0", input_tokens=1000, cached_input_tokens=400, output_tokens=200),  # 600×.075 + 400×.0375 + 200×.30 = 120
        ok("r1", input_tokens=2000, output_tokens=100),  # 2000×.075 + 100×.30 = 180
        expired,  # not billed; goes to the fallback route
    ])  # fmt: skip
    direct = dispatch(store, job, "openai", ["r2"], kind="direct")
    ingest(store, job, direct, "openai", [ok("r2", input_tokens=500, output_tokens=50)], now=NOW + 60)  # gpt-4o: 500×2.5 + 50×10 = 1750
    return job


def test_a_job_with_a_fallback_route_adds_up_as_worked_out_by_hand(store, tmp_path):
    _fallback_job(store, tmp_path)
    report = cost_report(store, job="tickets", by="route")
    total = report.total
    assert (total.attempts, total.failures, total.billed_failures, total.stale, total.unknown) == (4, 1, 0, 0, 0)
    assert (total.input_tokens, total.cached_input_tokens, total.cache_write_tokens, total.output_tokens) == (3500, 400, 0, 350)
    assert total.usd == D("0.00205")  # 120 + 180 + 0 + 1750 per M
    assert total.realtime_usd == D("0.00235")  # batch at real time: 240 + 360; real time as is: 1750
    assert (total.saving_usd, total.saving_percent) == (D("0.0003"), D("12.8"))  # 300 / 2350
    assert total.cache_hit_share == D("0.1143")  # 400 / 3500

    by_route = {g.group: g for g in report.groups}
    assert set(by_route) == {"openai-batch", "openai"}
    batch, realtime = by_route["openai-batch"], by_route["openai"]
    assert (batch.tiers, batch.attempts, batch.failures) == ({"batch"}, 3, 1)
    assert (batch.usd, batch.realtime_usd, batch.saving_usd, batch.saving_percent) == (D("0.0003"), D("0.0006"), D("0.0003"), D("50.0"))
    assert (realtime.tiers, realtime.usd, realtime.realtime_usd, realtime.saving_percent) == ({"realtime"}, D("0.00175"), D("0.00175"), D("0.0"))

    by_model = {g.group: (g.usd, g.attempts) for g in cost_report(store, by="model").groups}
    assert by_model == {"gpt-4o-mini": (D("0.0003"), 3), "gpt-4o": (D("0.00175"), 1)}

    as_json = report.as_dict()
    assert as_json["total"]["cost_usd"] == "0.00205" and as_json["total"]["saving_percent"] == "12.8"
    assert as_json["groups"][0]["group"] == "openai" and as_json["groups"][0]["realtime_usd"] == "0.00175"


def test_since_counts_attempts_from_that_time_on(store, tmp_path):
    _fallback_job(store, tmp_path)
    later = cost_report(store, since=NOW + 1).total
    assert (later.attempts, later.usd) == (1, D("0.00175"))  # only the real-time answer
    assert cost_report(store, since=NOW + 61).total.attempts == 0


def test_unknown_costs_are_counted_apart_by_tag_and_anthropic_cache_reads_count_as_input(store, tmp_path):
    _fallback_job(store, tmp_path)
    unknown = stored_job(store, tmp_path, name="eval", n=1, model="gpt-9-turbo", route="openai-batch", tags=["nightly"])
    ingest(store, unknown, dispatch(store, unknown, "openai-batch", ["r0"]), "openai-batch", [ok("r0", input_tokens=10, output_tokens=1)])
    claude = stored_job(store, tmp_path, name="claude", n=1, model="claude-haiku-4-5", route="anthropic-batch")
    usage = {"input_tokens": 300, "cached_input_tokens": 2000, "cache_write_tokens": 500, "output_tokens": 100}
    ingest(store, claude, dispatch(store, claude, "anthropic-batch", ["r0"]), "anthropic-batch", [ok("r0", **usage)])

    report = cost_report(store, by="tag")
    tags = {g.group: g for g in report.groups}
    assert set(tags) == {"nightly", "support", "(no tag)"}
    nightly = tags["nightly"]
    assert (nightly.attempts, nightly.usd, nightly.unknown, nightly.unknown_models) == (5, D("0.00205"), 1, {"gpt-9-turbo"})
    assert (tags["support"].attempts, tags["support"].unknown) == (4, 0)
    claude_figures = tags["(no tag)"]
    assert (claude_figures.input_tokens, claude_figures.usd) == (2800, D("0.0008125"))  # 300 + 2000 read + 500 written
    assert claude_figures.cache_hit_share == D("0.7143")  # 2000 / 2800
    assert (report.total.attempts, report.total.unknown) == (6, 1)  # a job with two tags counts once in the total
    assert report.total.usd == D("0.00205") + D("0.0008125")  # never the unknown one as $0
    assert report.as_dict()["total"]["unknown_cost_models"] == ["gpt-9-turbo"]


def test_an_unknown_job_is_named(store):
    with pytest.raises(JobNotFoundError, match='no job named "nope"'):
        cost_report(store, job="nope")


def test_attempts_from_before_the_ledger_have_an_unknown_cost(sqlite_store, tmp_path):
    """m004 on a store written before it: the columns are added, old attempts stay unknown."""
    job = stored_job(sqlite_store, tmp_path, n=1, model="gpt-4o-mini", route="openai-batch")
    ingest(sqlite_store, job, dispatch(sqlite_store, job, "openai-batch", ["r0"]), "openai-batch", [ok("r0", input_tokens=10)])
    with sqlite_store.begin() as conn:  # back to how an m003 store looked
        for column in ("model", "tier", "billed", "cost_picousd", "realtime_picousd"):
            conn.exec_driver_sql(f"ALTER TABLE attempts DROP COLUMN {column}")
        conn.exec_driver_sql("ALTER TABLE dispatches DROP COLUMN reserved_picousd")
        conn.execute(migrations.delete().where(migrations.c.name == "m004_cost_ledger"))
    reopened = Store(sqlite_store.location)
    with reopened.begin() as conn:
        assert sorted(conn.execute(sa.select(migrations.c.name)).scalars().all()) == [name for name, _ in MIGRATIONS]
        assert conn.execute(sa.select(attempts.c.model, attempts.c.cost_picousd)).all() == [(None, None)]
    total = cost_report(reopened).total
    reopened.close()
    assert (total.attempts, total.unknown, total.unknown_models, total.usd) == (1, 1, {"(not recorded)"}, 0)


def test_answers_that_failed_validation_are_failures_in_the_report(store, tmp_path):
    # Issue 15 item 9: every answer invalid (twice, with the repair retry): all attempts failed.
    job = stored_job(store, tmp_path, n=2, model="gpt-4o-mini", route="openai-batch", choices=["billing", "technical"])
    for _ in range(2):
        d = dispatch(store, job, "openai-batch", ["r0", "r1"])
        ingest(store, job, d, "openai-batch", [Outcome(c, True, text="no idea", usage=Usage(100, 0, 0, 10)) for c in ("r0", "r1")])
    total = cost_report(store, job="tickets").total
    assert (total.attempts, total.failures, total.billed_failures) == (4, 4, 4)
    assert total.as_dict()["failures"] == 4
