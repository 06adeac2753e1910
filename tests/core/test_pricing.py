"""The price catalog and the cost arithmetic, checked against costs computed by hand.

Prices used below (USD per million tokens, genai-prices 0.2.3, on the dates given):
gpt-4o 2.50 / cached 1.25 / out 10.00; gpt-5 1.25 / 0.125 / 10.00;
claude-sonnet-4 3.00 / read 0.30 / write 5m 3.75 / write 1h 6.00 / out 15.00.
Before genai-prices' batch and flex history starts (2026-10-14 and 2026-10-12), batch and
OpenAI flex are derived at 50 % of every real-time figure (prices.yaml `derived`); from then
on they are the package's own (gpt-4o batch keeps the standard cached rate: OpenAI's batch
table lists none). `EARLY` is a date before, `LATE` one after.
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

from lowtide.core.errors import InputError
from lowtide.core.pricing import (
    NOT_BILLED,
    PRICES_ENV,
    Billing,
    Tier,
    attempt_cost,
    billing_of,
    is_billed,
    load_catalog,
    outcome_cost,
    parse_price_file,
)
from lowtide.core.types import Outcome, Usage

D = Decimal
EARLY = date(2026, 3, 1)
LATE = date(2026, 11, 15)


@pytest.fixture(autouse=True)
def _no_user_prices(monkeypatch):
    monkeypatch.delenv(PRICES_ENV, raising=False)


# ---- routes to tiers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "options", "expected"),
    [
        ("openai-batch", {}, Billing("openai", Tier.BATCH)),
        ("anthropic-batch", {}, Billing("anthropic", Tier.BATCH)),
        ("anthropic-batch", {"cache_prefix": True}, Billing("anthropic", Tier.BATCH, "1h")),
        ("openai", {}, Billing("openai", Tier.REALTIME)),
        ("openai", {"service_tier": "flex"}, Billing("openai", Tier.FLEX)),
        ("anthropic", {}, Billing("anthropic", Tier.REALTIME)),
        ("openai-compatible", {}, Billing(None, Tier.SELF_HOSTED)),
        ("local", {}, Billing(None, Tier.SELF_HOSTED)),
        ("echo", {}, Billing(None, Tier.FREE)),
        ("echo-batch", {}, Billing(None, Tier.FREE)),
        ("some-plugin", {}, None),
    ],
)
def test_each_route_bills_at_its_tier(route, options, expected):
    assert billing_of(route, options) == expected


# ---- OpenAI: prompt tokens include the cached ones -------------------------------------


def test_openai_realtime_bills_cached_tokens_at_the_cached_rate():
    # 10,000 prompt tokens of which 4,000 cached; 2,000 completion tokens (500 reasoning).
    usage = Usage(input_tokens=10_000, cached_input_tokens=4_000, output_tokens=2_000, reasoning_tokens=500)
    cost = attempt_cost(usage, "gpt-4o", "openai", at=EARLY)
    # 6,000 × 2.50 + 4,000 × 1.25 + 2,000 × 10.00 = 15,000 + 5,000 + 20,000 = 40,000 per M
    assert cost.usd == D("0.04")
    assert cost.realtime_usd == D("0.04")
    assert cost.tier is Tier.REALTIME and cost.entry == "gpt-4o" and cost.billed


def test_openai_batch_is_half_and_keeps_the_realtime_equivalent():
    usage = Usage(input_tokens=10_000, cached_input_tokens=4_000, output_tokens=2_000, reasoning_tokens=500)
    cost = attempt_cost(usage, "gpt-4o", "openai-batch", at=EARLY)
    # derived: 6,000 × 1.25 + 4,000 × 0.625 + 2,000 × 5.00 = 7,500 + 2,500 + 10,000 = 20,000 per M
    assert cost.usd == D("0.02")
    assert cost.realtime_usd == D("0.04")
    assert cost.saving_usd == D("0.02")


def test_openai_batch_follows_the_packages_dated_prices():
    usage = Usage(input_tokens=10_000, cached_input_tokens=4_000, output_tokens=2_000)
    cost = attempt_cost(usage, "gpt-4o", "openai-batch", at=LATE)
    # genai-prices from 2026-10-14: input 1.25, cached input at the standard 1.25, output 5
    # 6,000 × 1.25 + 4,000 × 1.25 + 2,000 × 5 = 22,500 per M
    assert cost.usd == D("0.0225") and cost.realtime_usd == D("0.04")


def test_openai_flex_on_the_realtime_route():
    usage = Usage(input_tokens=1_000_000, cached_input_tokens=200_000, output_tokens=100_000, reasoning_tokens=60_000)
    cost = attempt_cost(usage, "gpt-5", "openai", {"service_tier": "flex"}, at=EARLY)
    # 0.8 M × 0.625 + 0.2 M × 0.0625 + 0.1 M × 5.00 = 0.5 + 0.0125 + 0.5
    assert cost.usd == D("1.0125")
    assert cost.tier is Tier.FLEX
    # real time: 0.8 × 1.25 + 0.2 × 0.125 + 0.1 × 10 = 1.0 + 0.025 + 1.0
    assert cost.realtime_usd == D("2.025")


def test_reasoning_tokens_are_not_added_twice():
    with_reasoning = Usage(input_tokens=100, output_tokens=1_000, reasoning_tokens=900)
    without = Usage(input_tokens=100, output_tokens=1_000)
    assert attempt_cost(with_reasoning, "o4-mini", "openai").usd == attempt_cost(without, "o4-mini", "openai").usd
    # 100 × 1.10 + 1,000 × 4.40 = 4,510 per M
    assert attempt_cost(without, "o4-mini", "openai").usd == D("0.00451")


@pytest.mark.parametrize("at", [EARLY, LATE])
def test_a_model_without_a_flex_price_has_an_unknown_flex_cost(at):
    # genai-prices lists no flex variant for gpt-4o on any date: flex is never derived for it
    cost = attempt_cost(Usage(input_tokens=1_000), "gpt-4o", "openai", {"service_tier": "flex"}, at=at)
    assert cost.usd is None and not cost.known
    assert cost.realtime_usd == D("0.0025")
    assert "no flex price" in cost.note


# ---- Anthropic: input excludes cache reads and writes ----------------------------------


ANTHROPIC_USAGE = Usage(input_tokens=1_000, cached_input_tokens=10_000, cache_write_tokens=2_000, output_tokens=500)


def test_anthropic_realtime_with_cache_reads_and_5_minute_writes():
    cost = attempt_cost(ANTHROPIC_USAGE, "claude-sonnet-4", "anthropic", at=EARLY)
    # 1,000 × 3 + 10,000 × 0.30 + 2,000 × 3.75 + 500 × 15 = 3,000 + 3,000 + 7,500 + 7,500
    assert cost.usd == D("0.021")


def test_anthropic_batch_with_1_hour_writes():
    cost = attempt_cost(ANTHROPIC_USAGE, "claude-sonnet-4-20250514", "anthropic-batch", {"cache_prefix": True}, at=EARLY)
    # 1,000 × 1.50 + 10,000 × 0.15 + 2,000 × 3.00 + 500 × 7.50 = 1,500 + 1,500 + 6,000 + 3,750
    assert cost.usd == D("0.01275")
    # the same tokens in real time, writes still 1 h: 3,000 + 3,000 + 12,000 + 7,500
    assert cost.realtime_usd == D("0.0255")


def test_anthropic_batch_with_5_minute_writes():
    cost = attempt_cost(ANTHROPIC_USAGE, "claude-sonnet-4", "anthropic-batch", at=EARLY)
    # 1,500 + 1,500 + 2,000 × 1.875 + 3,750
    assert cost.usd == D("0.0105")


# ---- self-hosted, free, unknown --------------------------------------------------------


@pytest.fixture
def hosted_prices(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(
        "self_hosted:\n"
        "  Llama-3.1-8B-Instruct:\n"
        "    gpu_hourly_usd: 2.50\n"
        "    input_tokens_per_second: 10000\n"
        "    output_tokens_per_second: 1000\n"
        "  slow-model:\n"
        "    gpu_hourly_usd: 1\n",
        encoding="utf-8",
    )
    return load_catalog(path)


def test_self_hosted_is_gpu_time_at_the_hourly_rate(hosted_prices):
    # 3.6 M prompt tokens at 10,000/s = 360 s; 360,000 output at 1,000/s = 360 s; 720 s × 2.50 / 3600
    usage = Usage(input_tokens=3_600_000, output_tokens=360_000)
    cost = attempt_cost(usage, "llama-3.1-8b-instruct", "openai-compatible", catalog=hosted_prices)
    assert cost.usd == D("0.5") and cost.realtime_usd == D("0.5")
    assert cost.tier is Tier.SELF_HOSTED
    # cached prompt tokens are not computed again: 1.8 M / 10,000 = 180 s; 540 s × 2.50 / 3600
    cached = Usage(input_tokens=3_600_000, cached_input_tokens=1_800_000, output_tokens=360_000)
    assert attempt_cost(cached, "llama-3.1-8b-instruct", "openai-compatible", catalog=hosted_prices).usd == D("0.375")


def test_self_hosted_without_throughput_or_entry_is_unknown(hosted_prices):
    slow = attempt_cost(Usage(input_tokens=10), "slow-model", "openai-compatible", catalog=hosted_prices)
    assert slow.usd is None and "throughput" in slow.note
    missing = attempt_cost(Usage(input_tokens=10), "mistral-7b", "openai-compatible", catalog=hosted_prices)
    assert missing.usd is None and "mistral-7b" in missing.note


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "all-MiniLM-L6-v2"])  # the embedded chat and embedding models
def test_the_embedded_models_are_priced_at_zero_with_a_note(model):
    cost = attempt_cost(Usage(input_tokens=5_000, output_tokens=10), model, "local")
    assert cost.usd == D(0) and cost.known
    assert "priced at 0" in cost.note


@pytest.mark.parametrize("route", ["echo", "echo-batch"])
def test_echo_is_free(route):
    cost = attempt_cost(Usage(input_tokens=5_000, output_tokens=10), "anything", route)
    assert cost.usd == D(0) and cost.tier is Tier.FREE


def test_an_unknown_model_is_unknown_not_zero():
    cost = attempt_cost(Usage(input_tokens=5_000), "gpt-99-ultra", "openai-batch")
    assert cost.usd is None and cost.realtime_usd is None and not cost.known
    assert '"gpt-99-ultra" is not in the price catalog' in cost.note


def test_an_unknown_route_is_unknown():
    cost = attempt_cost(Usage(input_tokens=5_000), "gpt-4o", "carrier-pigeon")
    assert cost.usd is None and "carrier-pigeon" in cost.note


# ---- names -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "model", "entry"),
    [
        # Entries are genai-prices' model ids, matched by the package's own rules.
        ("openai", "gpt-4o-mini", "gpt-4o-mini"),
        ("openai", "GPT-4o-Mini", "gpt-4o-mini"),
        ("openai", "gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("openai", "gpt-4o-2024-08-06", "gpt-4o"),
        ("openai", "chatgpt-4o-latest", "chatgpt-4o-latest"),  # its own, dearer entry there (was: gpt-4o)
        ("openai", "gpt-4.1-nano-2025-04-14", "gpt-4.1-nano"),
        ("anthropic", "claude-sonnet-4-0", "claude-sonnet-4-0"),
        ("anthropic", "claude-sonnet-4-20250514", "claude-sonnet-4-0"),
        ("anthropic", "claude-3-5-haiku-latest", "claude-3-5-haiku-latest"),
        ("anthropic", "claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("openai", "gpt-4o-mini-search", None),  # never a borrowed price
        ("openai", "gpt-4", "gpt-4"),  # the package knows it (the hand-made catalog did not)
        ("openai", "gpt-99-ultra", None),
        ("anthropic", "gpt-4o", None),
    ],
)
def test_aliases_and_snapshots_resolve_to_the_base_entry(provider, model, entry):
    found = load_catalog().lookup(provider, model)
    assert (found[0] if found else None) == entry


MODELS = [("openai", m) for m in ("gpt-5", "gpt-5-mini", "gpt-5-nano", "gpt-4.1", "gpt-4.1-mini", "gpt-4o", "gpt-4o-mini", "o3", "o4-mini")]
MODELS += [("anthropic", m) for m in ("claude-opus-4-5", "claude-sonnet-4-5", "claude-sonnet-4", "claude-haiku-4-5", "claude-3-5-haiku")]


@pytest.mark.parametrize(("provider", "model"), MODELS)
def test_derived_tiers_are_half_of_every_realtime_figure_with_their_source(provider, model):
    """Before the package's batch history, batch (and OpenAI flex where offered) is 50 % of
    every real-time figure of that date, and says where that rule comes from."""
    catalog = load_catalog()
    found = catalog.explain(provider, model, EARLY)
    assert found is not None and found.day == EARLY
    rt = found.prices.realtime
    for tier in ("batch", "flex"):
        prices = found.prices.tier_named(tier)
        if prices is None:
            assert tier in found.not_offered and tier not in found.origins
            continue
        assert f"derived.{provider}.{tier}" in found.origins[tier] and "50%" in found.origins[tier]
        for key in ("input", "output", "cached_input", "cache_write_5m", "cache_write_1h"):
            assert getattr(prices, key) == (None if getattr(rt, key) is None else getattr(rt, key) / 2), (model, tier, key)
    assert "genai-prices" in found.origins["realtime"]
    if provider == "anthropic":  # the package's Anthropic cache prices: 0.1x / 1.25x / 2x input
        assert (rt.cached_input, rt.cache_write_5m, rt.cache_write_1h) == (rt.input / 10, rt.input * D("1.25"), rt.input * 2)
        assert found.prices.flex is None


def test_a_tier_the_package_has_is_its_own_not_derived():
    found = load_catalog().explain("openai", "gpt-5", LATE)
    assert found is not None
    assert all("genai-prices" in found.origins[t] for t in ("realtime", "batch", "flex", "priority"))
    assert found.prices.flex.input == D("0.625") and found.prices.priority.input == D("2.5")


def test_the_shipped_file_keeps_only_what_the_package_lacks():
    catalog = load_catalog()
    assert catalog.date is not None and catalog.source
    assert all(not entries for entries in catalog.models.values())  # no hand-compiled model prices
    assert set(catalog.derived) == {"openai", "anthropic", "google"}
    assert all(rule.source for rules in catalog.derived.values() for rule in rules.values())
    assert "genai-prices" in catalog.describe()


# ---- the user's price file -------------------------------------------------------------


def test_a_user_file_replaces_entries_and_adds_new_ones(tmp_path, monkeypatch):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "openai:\n"
        "  gpt-4o:\n"
        "    realtime: {input: 5, output: 20}\n"
        "  my-finetune:\n"
        "    aliases: [ft:gpt-4o-mini:acme::abc]\n"
        "    realtime: {input: 0.30, output: 1.20}\n"
        "    batch: {input: 0.15, output: 0.60}\n",
        encoding="utf-8",
    )
    monkeypatch.setenv(PRICES_ENV, str(path))
    catalog = load_catalog()
    assert catalog.overrides == (str(path),)
    assert str(path) in catalog.describe()
    usage = Usage(input_tokens=1_000, cached_input_tokens=400, output_tokens=100)
    assert catalog.explain("openai", "gpt-4o").origins == {"realtime": f"price file {path}: openai.gpt-4o.realtime"}
    # the whole entry is replaced: no cached rate (input price), and no batch tier any more
    assert attempt_cost(usage, "gpt-4o", "openai", catalog=catalog).usd == D("0.007")  # 1,000 × 5 + 100 × 20
    assert attempt_cost(usage, "gpt-4o", "openai-batch", catalog=catalog).usd is None
    assert attempt_cost(usage, "ft:gpt-4o-mini:acme::abc", "openai-batch", catalog=catalog).usd == D("0.00021")
    # untouched entries stay
    assert catalog.lookup("openai", "gpt-4o-mini") is not None
    # --prices (an argument) wins over the environment variable
    other = tmp_path / "other.yaml"
    other.write_text("", encoding="utf-8")
    assert load_catalog(other).overrides == (str(other),)


def test_a_user_file_is_read_again_when_it_changes(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("openai:\n  x1:\n    realtime: {input: 1, output: 1}\n", encoding="utf-8")
    assert load_catalog(path).lookup("openai", "x1")
    path.write_text("openai:\n  x2:\n    realtime: {input: 1, output: 1}\n", encoding="utf-8")
    import os

    os.utime(path, ns=(1, 10**18))
    assert load_catalog(path).lookup("openai", "x2") and not load_catalog(path).lookup("openai", "x1")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "openai:\n  gpt-4o:\n    realtime: {input: 1, output: 2, cached: 0.5}\n",
            "my.yaml line 3: unknown key `openai.gpt-4o.realtime.cached`; known keys here: input, output, cached_input, cache_write_5m, cache_write_1h",
        ),
        (
            "openai:\n  gpt-4o:\n    realtime:\n      input: cheap\n      output: 2\n",
            "my.yaml line 4: `openai.gpt-4o.realtime.input`: Input should be a valid decimal; give USD per million tokens as a number, e.g. 2.50",
        ),
        (
            "openai:\n  gpt-4o:\n    batch: {input: 1, output: 2}\n",
            "my.yaml line 2: `openai.gpt-4o.realtime` is required",
        ),
        (
            "openai:\n  gpt-4o:\n    realtime: {input: -1, output: 2}\n",
            "my.yaml line 3: `openai.gpt-4o.realtime.input`: Input should be greater than or equal to 0",
        ),
        ("gemini:\n  gemini-2.5-pro: {}\n", "my.yaml line 1: unknown key `gemini`; known keys here: date, source, openai, anthropic, google, groq, together, novita, doubleword, mistral, openrouter, azure, aws, self_hosted, derived"),
        (
            "self_hosted:\n  llama:\n    gpu_hourly_usd: 2\n    tokens_per_second: 5\n",
            "my.yaml line 4: unknown key `self_hosted.llama.tokens_per_second`; known keys here: gpu_hourly_usd, input_tokens_per_second, output_tokens_per_second, note",
        ),
        ("openai: [gpt-4o]\n", "my.yaml line 1: `openai`: Input should be a valid dictionary"),
        ("openai:\n  gpt-4o: {realtime: {input: 1, output: 2}\n", "my.yaml line 3: not valid YAML"),
        ("openai:\n  a: {realtime: {input: 1, output: 2}}\nopenai: {}\n", "my.yaml line 3: key `openai` is given twice (first on line 1); keep one"),
        ("- gpt-4o\n", "my.yaml: a price file is a YAML mapping"),
    ],
)
def test_a_bad_price_file_names_the_line_key_and_fix(text, expected):
    with pytest.raises(InputError) as err:
        parse_price_file(text, "my.yaml")
    assert expected in str(err.value), str(err.value)


def test_an_empty_price_file_changes_nothing():
    assert parse_price_file("", "empty.yaml").openai == {}


def test_a_missing_price_file_names_the_file_and_where_it_came_from(tmp_path, monkeypatch):
    monkeypatch.setenv(PRICES_ENV, str(tmp_path / "nope.yaml"))
    with pytest.raises(InputError, match=rf"nope.yaml: cannot read the price file .*; fix \${PRICES_ENV}"):
        load_catalog()
    with pytest.raises(InputError, match="fix --prices"):
        load_catalog(tmp_path / "nope.yaml")


def test_a_bad_file_named_by_the_environment_is_reported_with_its_path(tmp_path, monkeypatch):
    path = tmp_path / "bad.yaml"
    path.write_text("openai:\n  gpt-4o:\n    realtime: {input: 1}\n", encoding="utf-8")
    monkeypatch.setenv(PRICES_ENV, str(path))
    with pytest.raises(InputError, match=rf"{path} line 3: `openai.gpt-4o.realtime.output` is required"):
        load_catalog()


# ---- what is billed --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ok", "code", "usage", "billed"),
    [
        (True, None, Usage(input_tokens=10, output_tokens=2), True),
        (True, None, Usage(), True),  # billed, at 0
        (False, "batch_expired", Usage(), False),
        (False, "batch_expired", Usage(input_tokens=10), False),  # never billed, whatever it says
        (False, "batch_cancelled", Usage(), False),
        (False, "expired", Usage(), False),
        (False, "rate_limit_exceeded", Usage(), False),
        (False, "rate_limit_error", Usage(), False),
        (False, "deadline_passed", Usage(), False),
        (False, "invalid_request_error", Usage(), False),  # Anthropic errored: no usage, not billed
        (False, "server_error", Usage(), False),
        (False, "invalid_output", Usage(input_tokens=50, output_tokens=8), True),  # answered, then failed the schema
        (False, "context_length_exceeded", Usage(input_tokens=9000), True),
    ],
)
def test_billability_rules(ok, code, usage, billed):
    assert is_billed(ok, code, usage) is billed


def test_an_unbilled_attempt_costs_nothing():
    expired = Outcome.failure("a", "batch_expired", "expired", True)
    cost = outcome_cost(expired, "gpt-4o", "openai-batch")
    assert cost.usd == D(0) and not cost.billed
    answered = Outcome("b", False, usage=Usage(input_tokens=1_000, output_tokens=100), error_code="invalid_output")
    assert outcome_cost(answered, "gpt-4o", "openai-batch").usd == D("0.00175")  # 1,000 × 1.25 + 100 × 5 (either date)
    assert "batch_cancelled" in NOT_BILLED
