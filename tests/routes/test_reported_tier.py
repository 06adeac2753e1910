"""The tier a provider says it served a request at becomes `Outcome.tier`, in lowtide's
words (issue 15 item 8; routes/openai/wire.py): real-time routes against a real HTTP server on
loopback (tests/routes/upstream.py), batch result lines as the providers write them."""

from __future__ import annotations

import pytest

from lowtide.routes.anthropic.batch import parse_result
from lowtide.routes.anthropic.direct import AnthropicMessagesRoute
from lowtide.routes.openai.batch import parse_result_line
from lowtide.routes.openai.direct import OpenAIChatRoute
from tests.routes.test_realtime_routes import FAST_RETRY, KEY, reqs, run
from tests.routes.upstream import Upstream


@pytest.fixture
def upstream():
    with Upstream() as server:
        yield server


@pytest.mark.parametrize(("asked", "tier"), [("auto", "realtime"), ("flex", "flex"), ("priority", "priority"), (None, "realtime")])
def test_openai_reports_the_tier_it_served(upstream, monkeypatch, asked, tier):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    options = {"base_url": f"{upstream.url}/v1", **FAST_RETRY} | ({"service_tier": asked} if asked else {})
    out = run(OpenAIChatRoute("openai", options), reqs(2))
    assert {o.tier for o in out.values()} == {tier}


def test_anthropic_reports_the_tier_it_served(upstream, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    out = run(AnthropicMessagesRoute({"base_url": upstream.url, **FAST_RETRY}), reqs(2))
    assert {o.tier for o in out.values()} == {"realtime"}  # usage.service_tier "standard"


def _openai_line(**body) -> dict:
    return {
        "custom_id": "r0",
        "response": {"status_code": 200, "body": {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}], **body}},
    }


@pytest.mark.parametrize(("reported", "tier"), [("default", "batch"), ("flex", "flex"), (None, None), (7, None), ("warp", None)])
def test_an_openai_batch_line_reports_its_tier(reported, tier):
    body = {} if reported is None else {"service_tier": reported}
    assert parse_result_line(_openai_line(**body)).tier == tier


@pytest.mark.parametrize(("reported", "tier"), [("batch", "batch"), ("standard", "batch"), ("priority", "priority"), (None, None)])
def test_an_anthropic_batch_result_reports_its_tier(reported, tier):
    usage = {"input_tokens": 1, "output_tokens": 1} | ({"service_tier": reported} if reported else {})
    message = {"content": [{"type": "text", "text": "x"}], "stop_reason": "end_turn", "usage": usage}
    assert parse_result("r0", {"type": "succeeded", "message": message}).tier == tier
