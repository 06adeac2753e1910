"""The cost ledger: each attempt priced from the provider's usage at the tier it used,
checked against costs worked out by hand from the shipped catalog (USD per million tokens).
Every test runs on both stores, through the engine's own ingest (`apply_outcomes`)."""

from __future__ import annotations

from decimal import Decimal

import pytest
import sqlalchemy as sa

from lowtide.core.pricing import load_catalog, outcome_cost
from lowtide.core.types import Outcome, Usage
from lowtide.engine.ledger import Ledger
from lowtide.store.money import from_pico
from lowtide.store.schema import attempts, events
from tests.engine.ledger_helpers import attempt_rows, dispatch, ingest, ok, release, stored_job

D = Decimal


def _cost(row) -> tuple[Decimal | None, Decimal | None]:
    return from_pico(row.cost_picousd), from_pico(row.realtime_picousd)


def test_openai_batch_with_cached_tokens(store, tmp_path):
    # gpt-4o-mini batch: input 0.075, cached 0.0375, output 0.30; real time 0.15, 0.075, 0.60.
    # prompt_tokens 1000 include 400 cached: 600 × 0.075 + 400 × 0.0375 + 200 × 0.30 = 120 per M.
    job = stored_job(store, tmp_path, model="gpt-4o-mini", route="openai-batch")
    d = dispatch(store, job, "openai-batch", ["r0"])
    ingest(store, job, d, "openai-batch", [ok("r0", input_tokens=1000, cached_input_tokens=400, output_tokens=200)])
    row = attempt_rows(store)[("r0", d)]
    assert (row.model, row.tier, row.billed) == ("gpt-4o-mini", "batch", True)
    assert _cost(row) == (D("0.00012"), D("0.00024"))  # real time: 90 + 30 + 120 per M


@pytest.mark.parametrize(
    ("options", "usd", "realtime"),
    [
        # haiku 4.5 batch: input 0.50, cache read 0.05, write 5 min 0.625, output 2.50; input
        # excludes the 2000 cache reads and 500 writes: 150 + 100 + 312.5 + 250 = 812.5 per M.
        ({}, D("0.0008125"), D("0.001625")),  # real time: 300 + 200 + 625 + 500
        # cache_prefix sends the 1-hour TTL: writes at 1.00 (batch), 2.00 (real time).
        ({"cache_prefix": True}, D("0.001"), D("0.002")),  # 150 + 100 + 500 + 250; 300 + 200 + 1000 + 500
    ],
)
def test_anthropic_batch_with_cache_reads_and_writes(store, tmp_path, options, usd, realtime):
    job = stored_job(store, tmp_path, model="claude-haiku-4-5-20251001", route="anthropic-batch", route_options=options)
    d = dispatch(store, job, "anthropic-batch", ["r0"])
    usage = {"input_tokens": 300, "cached_input_tokens": 2000, "cache_write_tokens": 500, "output_tokens": 100}
    ingest(store, job, d, "anthropic-batch", [ok("r0", **usage)])
    row = attempt_rows(store)[("r0", d)]
    assert (row.tier, row.cache_write_tokens) == ("batch", 500)
    assert _cost(row) == (usd, realtime)


def test_openai_realtime_and_flex_and_reasoning_tokens_are_not_added(store, tmp_path):
    # gpt-5-mini real time: input 0.25, cached 0.025, output 2.00; flex: 0.125, 0.0125, 1.00.
    # 2000 prompt tokens (1000 cached), 500 output of which 300 reasoning (already inside).
    usage = {"input_tokens": 2000, "cached_input_tokens": 1000, "output_tokens": 500, "reasoning_tokens": 300}
    realtime = stored_job(store, tmp_path, model="gpt-5-mini", route="openai")
    d = dispatch(store, realtime, "openai", ["r0"], kind="direct")
    ingest(store, realtime, d, "openai", [ok("r0", **usage)])
    row = attempt_rows(store)[("r0", d)]
    assert row.tier == "realtime"
    assert _cost(row) == (D("0.001275"), D("0.001275"))  # 250 + 25 + 1000 per M

    flex = stored_job(store, tmp_path, name="flex", model="gpt-5-mini", route="openai", route_options={"service_tier": "flex"})
    d = dispatch(store, flex, "openai", ["r0"], kind="direct")
    ingest(store, flex, d, "openai", [ok("r0", **usage)])
    row = attempt_rows(store)[("r0", d)]
    assert row.tier == "flex"
    assert _cost(row) == (D("0.0006375"), D("0.001275"))  # 125 + 12.5 + 500 per M


def test_self_hosted_costs_gpu_time_and_echo_is_free(store, tmp_path, monkeypatch):
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "self_hosted:\n  llama-3.1-8b-instruct:\n    gpu_hourly_usd: 3.60\n"
        "    input_tokens_per_second: 12000\n    output_tokens_per_second: 1500\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("LOWTIDE_PRICES", str(prices))
    job = stored_job(store, tmp_path, model="llama-3.1-8b-instruct", route="openai-compatible")
    d = dispatch(store, job, "openai-compatible", ["r0"], kind="direct")
    # (24000 - 12000 cached) / 12000 + 3000 / 1500 = 3 s of a $3.60/h GPU = $0.003
    ingest(store, job, d, "openai-compatible", [ok("r0", input_tokens=24000, cached_input_tokens=12000, output_tokens=3000)])
    row = attempt_rows(store)[("r0", d)]
    assert (row.tier, *_cost(row)) == ("self_hosted", D("0.003"), D("0.003"))

    echo = stored_job(store, tmp_path, name="echo-job", model="anything", route="echo")
    d = dispatch(store, echo, "echo", ["r0"], kind="direct")
    ingest(store, echo, d, "echo", [ok("r0", input_tokens=5000, output_tokens=5000)])
    row = attempt_rows(store)[("r0", d)]
    assert (row.tier, row.billed, *_cost(row)) == ("free", True, D(0), D(0))


def test_billed_and_unbilled_failures(store, tmp_path):
    job = stored_job(store, tmp_path, n=3, model="gpt-4o-mini", route="openai-batch", retry={"max_attempts": 1})
    d = dispatch(store, job, "openai-batch", ["r0", "r1", "r2"])
    ingest(store, job, d, "openai-batch", [
        # processed, then failed: billed at its usage (100 × 0.075 + 10 × 0.30 = 10.5 per M)
        Outcome("r0", False, usage=Usage(input_tokens=100, output_tokens=10), error_code="server_error", error_message="x"),
        # expired in its batch: never billed, whatever usage it carries
        Outcome("r1", False, usage=Usage(input_tokens=100), error_code="batch_expired", error_message="x", retryable=True),
        # an error without usage: not billed
        Outcome.failure("r2", "invalid_request", "bad", False),
    ])  # fmt: skip
    rows = attempt_rows(store)
    assert (rows[("r0", d)].billed, *_cost(rows[("r0", d)])) == (True, D("0.0000105"), D("0.000021"))
    assert (rows[("r1", d)].billed, *_cost(rows[("r1", d)])) == (False, D(0), D(0))
    assert (rows[("r2", d)].billed, *_cost(rows[("r2", d)])) == (False, D(0), D(0))


def test_an_unknown_model_has_an_unknown_cost_and_an_event_says_why(store, tmp_path):
    job = stored_job(store, tmp_path, n=2, model="gpt-9-turbo", route="openai-batch")
    d = dispatch(store, job, "openai-batch", ["r0", "r1"])
    ingest(store, job, d, "openai-batch", [ok("r0", input_tokens=10, output_tokens=1)])
    ingest(store, job, d, "openai-batch", [ok("r1", input_tokens=10, output_tokens=1)])  # a second chunk
    rows = attempt_rows(store)
    assert all((r.model, r.tier, r.billed, r.cost_picousd, r.realtime_picousd) == ("gpt-9-turbo", "batch", True, None, None) for r in rows.values())
    with store.begin() as conn:
        said = conn.execute(sa.select(events.c.kind, events.c.message).where(events.c.kind == "cost_unknown")).all()
    assert said == [("cost_unknown", 'cost of attempts on openai-batch (gpt-9-turbo) is unknown: openai model "gpt-9-turbo" '
                     "is not in the price catalog; add it to a price file (docs/costs.md)")]  # fmt: skip


def test_a_broken_price_file_loses_no_result(store, tmp_path, monkeypatch):
    bad = tmp_path / "prices.yaml"
    bad.write_text("openai:\n  gpt-4o-mini:\n    realtime: {input: 0.15}\n", encoding="utf-8")
    monkeypatch.setenv("LOWTIDE_PRICES", str(bad))
    job = stored_job(store, tmp_path, model="gpt-4o-mini", route="openai-batch")
    d = dispatch(store, job, "openai-batch", ["r0"])
    counts = ingest(store, job, d, "openai-batch", [ok("r0", input_tokens=10, output_tokens=1)])
    assert counts.succeeded == 1
    row = attempt_rows(store)[("r0", d)]
    assert (row.input_tokens, row.billed, row.cost_picousd) == (10, True, None)
    with store.begin() as conn:
        [message] = conn.execute(sa.select(events.c.message).where(events.c.kind == "cost_unknown")).scalars().all()
    assert "the price file did not load" in message and "`openai.gpt-4o-mini.realtime.output` is required" in message


def test_reingesting_the_same_results_never_counts_a_cost_twice(store, tmp_path):
    job = stored_job(store, tmp_path, n=2, model="gpt-4o-mini", route="openai-batch")
    d = dispatch(store, job, "openai-batch", ["r0", "r1"])
    results = [ok("r0", input_tokens=1000, output_tokens=100), ok("r1", input_tokens=1000, output_tokens=100)]
    ingest(store, job, d, "openai-batch", results)
    again = ingest(store, job, d, "openai-batch", results + results)  # the whole file twice more
    assert (again.succeeded, again.stale) == (0, 0)
    with store.begin() as conn:
        n, total = conn.execute(sa.select(sa.func.count(), sa.func.sum(attempts.c.cost_picousd))).one()
    assert (n, from_pico(total)) == (2, D("0.00021"))  # 2 × (1000 × 0.075 + 100 × 0.30) per M


def test_a_stale_result_is_paid_for_recorded_with_its_cost_and_flagged(store, tmp_path):
    job = stored_job(store, tmp_path, n=1, model="gpt-4o-mini", route="openai-batch", fallback={"route": "openai"})
    batch = dispatch(store, job, "openai-batch", ["r0"])
    release(store, batch)  # left behind at a cut-over: the request goes to the fallback route
    direct = dispatch(store, job, "openai", ["r0"], kind="direct")
    ingest(store, job, direct, "openai", [ok("r0", input_tokens=1000, output_tokens=100)])
    late = ingest(store, job, batch, "openai-batch", [ok("r0", input_tokens=1000, output_tokens=100)])
    assert late.stale == 1
    rows = attempt_rows(store)
    assert (rows[("r0", direct)].applied, *_cost(rows[("r0", direct)])) == (True, D("0.00021"), D("0.00021"))
    assert (rows[("r0", batch)].applied, *_cost(rows[("r0", batch)])) == (False, D("0.000105"), D("0.00021"))


USAGES = [
    Usage(1000, 400, 0, 200, 0), Usage(300, 2000, 500, 100, 50), Usage(0, 0, 0, 0, 0),
    Usage(24000, 12000, 0, 3000, 0), Usage(7, 9, 3, 1, 1),
]  # fmt: skip
CASES = [
    ("gpt-4o-mini", "openai-batch", {}), ("gpt-4o-mini-2024-07-18", "openai", {}), ("gpt-5-mini", "openai", {"service_tier": "flex"}),
    ("gpt-4o-mini", "openai", {"service_tier": "flex"}), ("claude-haiku-4-5", "anthropic-batch", {"cache_prefix": True}),
    ("claude-sonnet-4-5", "anthropic", {}), ("smollm2-135m-instruct", "local", {}), ("llama", "openai-compatible", {}),
    ("x", "echo", {}), ("x", "echo-batch", {}), ("gpt-9", "openai-batch", {}), ("x", "a-plugin", {}),
]  # fmt: skip


@pytest.mark.parametrize(("model", "route", "options"), CASES)
def test_the_ledgers_cached_rates_price_exactly_as_the_catalogs_arithmetic(model, route, options):
    catalog = load_catalog()
    ledger = Ledger(catalog)
    rate = ledger.rate(route, options, model)
    for usage in USAGES:
        for outcome in (Outcome("c", True, usage=usage), Outcome("c", False, usage=usage, error_code="server_error"),
                        Outcome("c", False, usage=usage, error_code="expired")):  # fmt: skip
            cost = outcome_cost(outcome, model, route, options, catalog=catalog)
            billed, usd, realtime = ledger.columns(outcome, rate)
            assert billed == cost.billed
            assert (from_pico(usd), from_pico(realtime)) == (cost.usd, cost.realtime_usd), (model, route, usage)


# issue 15 items 3, 8, 9 ----------------------------------------------------------------


def test_an_attempt_is_priced_as_the_model_its_request_was_sent_with(store, tmp_path):
    # Sent as gpt-4o-mini; the job's spec was replaced by one saying gpt-4o afterwards (what
    # a store from before refused spec changes holds). gpt-4o-mini batch: 1000 × 0.075 +
    # 200 × 0.30 = 135 per M; gpt-4o would have been 1000 × 1.25 + 200 × 5 = 2250 (~16×).
    from lowtide.engine.context import JobContext
    from lowtide.store.schema import jobs

    job = stored_job(store, tmp_path, model="gpt-4o-mini", route="openai-batch")
    d = dispatch(store, job, "openai-batch", ["r0"])
    with store.begin() as conn:
        spec = job.spec.model_copy(update={"model": "gpt-4o"})
        conn.execute(jobs.update().where(jobs.c.id == job.id).values(spec=spec.model_dump_json()))
        job = JobContext.from_row(conn.execute(sa.select(jobs).where(jobs.c.id == job.id)).one())
    ingest(store, job, d, "openai-batch", [ok("r0", input_tokens=1000, output_tokens=200)])
    row = attempt_rows(store)[("r0", d)]
    assert row.model == "gpt-4o-mini"
    assert _cost(row) == (D("0.000135"), D("0.00027"))


@pytest.mark.parametrize(
    ("route", "options", "reported", "tier", "usd"),
    [
        # gpt-5-mini, 2000 input, 500 output. Asked for auto; the provider served flex:
        # 2000 × 0.125 + 500 × 1.00 = 750 per M, not real time's 1500.
        ("openai", {"service_tier": "auto"}, "flex", "flex", D("0.00075")),
        # Asked for flex; served at the standard tier: real time, 2000 × 0.25 + 500 × 2 = 1500.
        ("openai", {"service_tier": "flex"}, "realtime", "realtime", D("0.0015")),
        # Served at priority: the shipped catalog has no priority prices, so unknown, never a guess.
        ("openai", {"service_tier": "priority"}, "priority", "priority", None),
        # Nothing reported: the configured tier.
        ("openai", {"service_tier": "flex"}, None, "flex", D("0.00075")),
    ],
)
def test_the_tier_the_provider_reports_is_the_tier_priced(store, tmp_path, route, options, reported, tier, usd):
    job = stored_job(store, tmp_path, model="gpt-5-mini", route=route, route_options=options)
    d = dispatch(store, job, route, ["r0"], kind="direct")
    outcome = Outcome("r0", True, text="billing", usage=Usage(input_tokens=2000, output_tokens=500), tier=reported)
    ingest(store, job, d, route, [outcome])
    row = attempt_rows(store)[("r0", d)]
    assert row.tier == tier
    assert _cost(row)[0] == usd


def test_an_answer_that_fails_validation_is_a_failed_attempt_still_billed(store, tmp_path):
    # gpt-4o-mini batch, choices billing/technical: "no idea" is invalid, then invalid again.
    job = stored_job(store, tmp_path, model="gpt-4o-mini", route="openai-batch", choices=["billing", "technical"])
    first = dispatch(store, job, "openai-batch", ["r0"])
    bad = Outcome("r0", True, text="no idea", usage=Usage(input_tokens=1000, output_tokens=200))
    ingest(store, job, first, "openai-batch", [bad])
    second = dispatch(store, job, "openai-batch", ["r0"])
    ingest(store, job, second, "openai-batch", [bad])
    rows = attempt_rows(store)
    for d in (first, second):
        row = rows[("r0", d)]
        assert (row.ok, row.error_code, row.billed) == (False, "invalid_output", True)
        assert _cost(row)[0] == D("0.000135")
    assert "after one repair attempt" in rows[("r0", second)].error_message


def test_the_ledger_prices_an_attempt_at_its_own_dates_prices():
    """genai-prices' batch price for gpt-4o starts 2026-10-14 with no cached-input discount;
    before it, lowtide derives 50 % of every real-time figure. The date is the attempt's."""
    from datetime import UTC, datetime

    from lowtide.core.pricing import load_catalog
    from lowtide.core.types import Outcome as O
    from lowtide.core.types import Usage as U
    from lowtide.engine.ledger import Ledger

    ledger = Ledger(load_catalog())
    outcome = O("a", True, usage=U(input_tokens=1_000_000, cached_input_tokens=1_000_000))
    early = datetime(2026, 3, 1, tzinfo=UTC).timestamp()
    late = datetime(2026, 11, 15, tzinfo=UTC).timestamp()
    _, early_cost, _ = ledger.columns(outcome, ledger.rate("openai-batch", {}, "gpt-4o", None, early))
    _, late_cost, _ = ledger.columns(outcome, ledger.rate("openai-batch", {}, "gpt-4o", None, late))
    assert (early_cost, late_cost) == (625_000_000_000, 1_250_000_000_000)  # picodollars: $0.625, $1.25
