"""Capability cards (core/cards.py): every route has one, the code uses the card's figures,
and a route option the card contradicts is refused before anything is sent."""

from __future__ import annotations

import asyncio
import json

import pytest
import sqlalchemy as sa

from lowtide.core.cards import CARDS
from lowtide.core.errors import RouteError
from lowtide.core.pricing import PROVIDERS, Tier, billing_of, load_catalog
from lowtide.engine import batches, turnaround
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.routes import create_route, known_routes
from lowtide.routes.anthropic import batch as anthropic_batch
from lowtide.routes.gemini import batch as gemini_batch
from lowtide.routes.openai import batch as openai_batch
from lowtide.store.payloads import payload_bytes
from lowtide.store.schema import dispatches, requests
from tests.cli.test_cli import Cli
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import KEY_ENV

PROVIDER_BATCH = ("openai-batch", "anthropic-batch", "gemini-batch")


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key-of-some-length")
    for name, value in {"AWS_ACCESS_KEY_ID": "AKIATESTTESTTEST", "AWS_SECRET_ACCESS_KEY": "test-secret-of-some-length",
                        "AWS_EC2_METADATA_DISABLED": "true"}.items():  # bedrock-batch: no instance metadata looked for
        monkeypatch.setenv(name, value)


def _options(name: str, tmp_path, **more) -> dict:
    if name in PROVIDER_BATCH or name in ("openai", "anthropic", "gemini", "mistral-batch", "openrouter-batch", "digitalocean-batch"):
        return {"api_key_env": KEY_ENV, **more}
    if name in ("openai-compatible", "openai-compatible-batch"):
        return {"base_url": "http://127.0.0.1:9/v1", "api_key_env": KEY_ENV, **more} if name.endswith("batch") else {"base_url": "http://127.0.0.1:9/v1", **more}
    if name == "azure-batch":
        return {"endpoint": "http://127.0.0.1:9", "api_key_env": KEY_ENV, **more}
    if name == "echo-batch":
        return {"dir": str(tmp_path / "echo-batch"), **more}
    if name == "bedrock-batch":  # an IAM role and an S3 place are required; credentials come from `key`
        return {"role_arn": "arn:aws:iam::123456789012:role/B", "staging": "s3://b-ok/x", "region": "us-east-1", **more}
    if name == "vertex-batch":  # a project, a Cloud Storage place and a token
        return {"project": "p", "staging": "gs://b-ok/x", "access_token_env": KEY_ENV, **more}
    return dict(more)


def test_every_registered_route_has_a_card_of_its_kind(key, tmp_path):
    assert set(known_routes()) <= set(CARDS), "a route without a card: add one to core/cards.py"
    for name in known_routes():
        card = CARDS[name]
        assert card.name == name
        assert create_route(name, _options(name, tmp_path)).kind == card.kind, name
        assert (card.kind == "batch") == (card.lines is not None and card.recovery is not None), name
        for field in card.unconfirmed:  # names a field that exists
            head, _, rest = field.partition(".")
            assert hasattr(card, head) and (not rest or hasattr(getattr(card, head), rest)), (name, field)


@pytest.mark.parametrize("name", [*PROVIDER_BATCH, "echo-batch"])
def test_a_batch_route_plans_within_its_cards_limits_and_reads_its_states(name, key, tmp_path):
    card = CARDS[name]
    route = create_route(name, _options(name, tmp_path))
    assert route.limits.max_bytes == card.limits.max_bytes
    assert route.limits.one_model_per_batch == card.limits.one_model_per_batch
    if card.limits.max_requests is not None:
        assert route.limits.max_requests == card.limits.max_requests
    assert card.ended_states() <= set(card.status)


def test_the_routes_read_their_cards_states_and_key():
    assert {"completed", "failed", "expired", "cancelled"} == openai_batch.TERMINAL
    assert openai_batch.METADATA_KEY == "lowtide_key"
    assert {"ended"} == anthropic_batch.TERMINAL
    assert {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"} == gemini_batch.TERMINAL


@pytest.mark.parametrize(
    ("name", "option", "value", "words"),
    [
        ("openai-batch", "max_requests", 50_001, ("OpenAI's limit of 50,000 requests a batch", "give at most 50,000")),
        ("anthropic-batch", "max_requests", 200_000, ("Anthropic's limit of 100,000 requests", "give at most 100,000")),
        ("anthropic-batch", "max_bytes", 300 * 2**20, ("Anthropic's limit of 268,435,456 bytes", "route_options.max_bytes out")),
        ("gemini-batch", "inline_bytes", 30 * 2**20, ("Google's limit of 20,971,520 bytes inline", "give at most")),
        # Google documents no request count: the card's is lowtide's own bound, and says so
        ("gemini-batch", "max_requests", 100_001, ("over lowtide's bound of 100,000 requests a batch", "give at most 100,000")),
    ],
)
def test_a_route_option_over_the_cards_limit_is_refused_naming_the_provider_the_limit_and_the_fix(name, option, value, words, key, tmp_path):
    with pytest.raises(RouteError) as refused:
        create_route(name, _options(name, tmp_path, **{option: value}))
    said = str(refused.value)
    assert said.startswith(f"{name}: route_options.{option} is {value:,}")
    for w in words:
        assert w in said, said
    # At the limit, or under it, is kept: a tighter limit is the user's to choose.
    limit = getattr(CARDS[name].limits, option)
    assert create_route(name, _options(name, tmp_path, **{option: limit}))
    tighter = create_route(name, _options(name, tmp_path, **{option: 5}))
    assert (tighter.inline_bytes if option == "inline_bytes" else getattr(tighter.limits, option)) == 5


def test_the_planner_never_makes_a_batch_over_the_cards_limits(key, sqlite_store, clock, tmp_path, monkeypatch):
    """A card with a small limit (a stand-in for OpenAI's 50,000) and a job asking for bigger
    chunks: every planned batch keeps within the card, by count and by bytes."""
    card = CARDS["openai-batch"]
    limits = card.limits.model_copy(update={"max_requests": 7, "max_bytes": 3000})
    monkeypatch.setitem(CARDS, "openai-batch", card.model_copy(update={"limits": limits}))
    source = write_csv(tmp_path / "t.csv", ticket_rows(60))
    spec = make_spec(source, route="openai-batch", model="gpt-4o-mini", chunk_size=1000, route_options={"api_key_env": KEY_ENV})
    load_job(sqlite_store, spec, clock)

    async def plan_all():
        async with Engine(sqlite_store, clock) as engine:
            job = engine._jobs("tickets")[0]
            route = engine.route_for(job.lanes[0])
            assert route.limits.max_requests == 7
            while batches.plan(sqlite_store, job, route, clock):
                pass

    asyncio.run(plan_all())
    with sqlite_store.begin() as conn:
        sizes = conn.execute(sa.select(dispatches.c.size)).scalars().all()
        payloads = conn.execute(sa.select(requests.c.dispatch_id, sa.func.sum(payload_bytes() + batches.LINE_OVERHEAD))
                                .group_by(requests.c.dispatch_id)).all()  # fmt: skip
    assert sum(sizes) == 60 and max(sizes) <= 7
    assert all(nbytes <= 3000 for _, nbytes in payloads)


def test_what_prices_and_auto_routing_read_is_the_cards():
    catalog = load_catalog()
    for name, card in CARDS.items():
        billing = billing_of(name)
        assert billing is not None and billing.provider == card.billing and billing.tier is Tier(card.tier)
        if card.kind == "batch" and card.billing in PROVIDERS:  # the discount the price data derives
            assert card.discount is not None and catalog.derived[card.billing]["batch"].factor == card.discount.factor
        elif card.kind == "batch" and card.billing is not None:  # a price list lowtide has not: no estimate, said
            assert card.billing not in catalog.derived and (card.discount is None or card.discount.source)
        if card.turnaround is not None:
            assert turnaround.PRIORS[name] == card.turnaround
    assert turnaround.PRIORS["openai:flex"] == CARDS["openai"].tier_turnaround["flex"]
    # A batch route's prior never promises longer than the provider lets a batch run.
    for card in CARDS.values():
        if card.turnaround and card.retention.window_s:
            assert card.turnaround.p95 <= card.retention.window_s


def test_lowtide_routes_lists_every_route_and_shows_a_whole_card(tmp_path):
    cli = Cli(tmp_path, str(tmp_path / "lowtide.db"))
    (code, listed), (one_code, one), (table_code, table), (bad_code, bad) = cli.many(
        ("routes", "--json"), ("routes", "anthropic-batch", "--json"), ("routes",), ("routes", "nope")
    )
    assert code == 0, listed
    cards = json.loads(listed)
    # a profile's card is ROUTE:PROFILE; openai-compatible-batch is listed before its entry point is installed
    assert {n.split(":", 1)[0] for n in cards} == set(known_routes()) | {"openai-compatible-batch"}
    assert cards["openai-batch"]["limits"]["max_requests"] == 50_000
    assert cards["openai-compatible-batch:together"]["wire"]["purpose"] == "batch-api"
    assert one_code == 0 and json.loads(one) == cards["anthropic-batch"]
    assert cards["anthropic-batch"]["recovery"]["how"] == "match" and cards["anthropic-batch"]["retention"]["results_s"] == 29 * 86400
    assert table_code == 0 and all(name in table for name in known_routes()) and "100,000" in table
    assert bad_code == 2 and 'no route "nope"; known routes: anthropic' in bad
