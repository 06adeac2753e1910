"""openai-compatible-batch: a job through each profile against `lowtide serve` (run with a
key), the official openai SDK on both sides; what serve received is what the provider wants:
the upload's purpose, the key in its header, the limits and prices of the profile's card."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from importlib.metadata import EntryPoint

import openai
import pytest
import sqlalchemy as sa

from lowtide import routes
from lowtide.core.cards import CARDS, card_of, profiles_of
from lowtide.core.clock import SystemClock
from lowtide.core.errors import RouteError
from lowtide.core.pricing import attempt_cost, billing_of
from lowtide.core.types import Request, Usage
from lowtide.engine.loader import load_job
from lowtide.routes.openai.compatible_batch import NAME, create
from lowtide.store.db import Store
from lowtide.store.schema import requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import KEY_ENV, _run

KEY = "test-key"  # what the fixture puts in KEY_ENV, and serve is told to accept
# the purpose each profile's provider wants on the upload (its docs; core/cards.py)
PURPOSE = {"groq": "batch", "together": "batch-api", "novita": "batch", "doubleword": "batch"}


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    """The route as its entry point registers it (pyproject's `lowtide.routes` group), for an
    installation whose metadata predates it."""
    found = dict(routes._entry_points())
    found.setdefault(NAME, EntryPoint(NAME, "lowtide.routes.openai.compatible_batch:create", routes.ENTRY_POINT_GROUP))
    monkeypatch.setattr(routes, "_entry_points", lambda: found)


def _options(profile: str, url: str, **more) -> dict:
    return {"profile": profile, "base_url": f"{url}/v1", "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2], **more}


@pytest.mark.parametrize("profile", profiles_of(NAME))
def test_a_job_runs_through_each_profile_as_its_provider_wants_it(profile, serve, tmp_path):
    url = serve("--api-key", KEY)  # a request without the key in a header serve reads is refused
    source = write_csv(tmp_path / "t.csv", ticket_rows(12))
    spec = make_spec(source, route=NAME, route_options=_options(profile, url, max_requests=5))
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 12}
    with store.begin() as conn:
        outputs = dict(conn.execute(sa.select(requests.c.custom_id, requests.c.output)).all())
    assert outputs["T1003"] == "Ticket: ticket 1003 about shipping"  # echo, matched by custom_id
    client = openai.OpenAI(api_key=KEY, base_url=f"{url}/v1")
    uploads = [f for f in client.files.list() if f.purpose not in ("batch_output",)]
    assert len(uploads) == 3  # 5 + 5 + 2
    assert {f.purpose for f in uploads} == {PURPOSE[profile]}
    assert {b.completion_window for b in client.batches.list()} == {"24h"}


def test_serve_takes_the_key_in_azures_api_key_header(serve):
    url = serve("--api-key", KEY)

    class AzureKeyed(openai.OpenAI):  # the key as Azure OpenAI takes it, and no Authorization header
        @property
        def auth_headers(self) -> dict[str, str]:
            return {"api-key": self.api_key}

    assert AzureKeyed(api_key=KEY, base_url=f"{url}/v1").batches.list().data == []
    with pytest.raises(openai.AuthenticationError):
        AzureKeyed(api_key="wrong", base_url=f"{url}/v1").batches.list()


def test_each_profile_defaults_to_its_providers_url_key_and_purpose(monkeypatch):
    monkeypatch.setenv("GROQ_API_KEY", "g")
    monkeypatch.setenv("TOGETHER_API_KEY", "t")
    groq = create({"profile": "groq"})
    assert str(groq.client.base_url) == "https://api.groq.com/openai/v1/"
    assert (groq.client.api_key, groq.purpose, groq.completion_window) == ("g", "batch", "24h")
    together = create({"profile": "together"})
    assert str(together.client.base_url) == "https://api.together.xyz/v1/"
    assert (together.client.api_key, together.purpose) == ("t", "batch-api")
    assert together.limits.max_requests == 50_000 and together.limits.max_bytes == 100 * 2**20
    # a user's base_url and key variable win over the profile's
    monkeypatch.setenv("MY_GROQ", "mine")
    mine = create({"profile": "groq", "base_url": "http://127.0.0.1:9/v1", "api_key_env": "MY_GROQ"})
    assert (str(mine.client.base_url), mine.client.api_key) == ("http://127.0.0.1:9/v1/", "mine")
    assert mine.poll_interval[0] <= 1.0  # on this machine: polled soon


def test_what_a_profile_cannot_take_is_refused_naming_the_fix(monkeypatch):
    monkeypatch.setenv("GROQ_API_KEY", "g")
    monkeypatch.setenv("NOVITA_API_KEY", "n")
    with pytest.raises(RouteError, match="known: groq, together, novita, doubleword"):
        create({"profile": "fireworks"})
    with pytest.raises(RouteError, match="give route_options.base_url"):
        create({"profile": "novita"})  # its base URL is not confirmed here: the user gives it
    with pytest.raises(RouteError, match="give at most 50,000"):
        create({"profile": "groq", "max_requests": 60_000})
    with pytest.raises(RouteError, match="unknown route_options"):
        create({"profile": "groq", "tier": 3})  # OpenAI's usage tiers are not Groq's
    refused = create({"profile": "groq"}).refusal(Request("a", "/v1/embeddings", {"model": "m", "input": "x"}))
    assert refused is not None and "Groq takes /v1/chat/completions" in refused.reason


def test_each_profile_is_a_card_with_its_discount_and_wire():
    for profile in profiles_of(NAME):
        card = card_of(NAME, {"profile": profile})
        assert card is CARDS[f"{NAME}:{profile}"] and card.wire is not None and card.kind == "batch"
        assert card.discount is None or card.discount.factor is not None or "discount.factor" in card.unconfirmed
    assert CARDS[f"{NAME}:groq"].discount.factor == 0.75  # Groq: 25% off, not 50%
    assert card_of(NAME) is CARDS[NAME] and card_of(NAME, {"profile": "nope"}) is CARDS[NAME]


def test_a_profile_bills_by_its_card_and_says_when_no_price_is_known():
    assert billing_of(NAME, {"profile": "groq"}).provider == "groq"
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    # genai-prices' Groq list; its batch variant where it has one (from 2026-10-14), else the card's 25% off
    cost = attempt_cost(usage, "openai/gpt-oss-120b", NAME, {"profile": "groq"}, at=date(2026, 12, 1))
    assert (cost.usd, cost.realtime_usd) == (Decimal("0.375"), Decimal("0.75"))
    cost = attempt_cost(usage, "llama-3.1-8b-instant", NAME, {"profile": "groq"}, at=date(2026, 12, 1))
    assert (cost.usd, cost.realtime_usd) == (Decimal("0.0975"), Decimal("0.13"))
    # Together states no flat discount: no batch price, and the note says how to add one
    cost = attempt_cost(usage, "openai/gpt-oss-120b", NAME, {"profile": "together"}, at=date(2026, 12, 1))
    assert cost.usd is None and cost.realtime_usd == Decimal("0.75")
    assert "add `batch:` prices for openai/gpt-oss-120b under `together:` in a price file" in cost.note
    cost = attempt_cost(usage, "no-such-model", NAME, {"profile": "doubleword"})
    assert cost.usd is None and "add it under `doubleword:` in a price file" in cost.note
