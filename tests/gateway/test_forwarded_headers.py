"""Issue 34 N7: what a client's request carries goes to the upstream with the gateway's key,
so only headers that describe the body and the answer wanted go up (proxy.FORWARDED);
`OpenAI-Organization`, `OpenAI-Project`, `anthropic-beta`, an `Idempotency-Key` and the
rest are dropped. The cases are what the official SDKs send at their defaults, with each of
their account and beta options set, read off the wire by a recording server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

from lowtide.server.gateway.proxy import FORWARDED

from .conftest import KEYS, UPSTREAM_KEY, Upstream, serving

# What the transport adds on its own, on any hop (not the client's to choose).
TRANSPORT = {"host", "content-length", "connection", "accept-encoding"}
EXTRA = {"idempotency-key": "same-key-as-another-tenant", "openai-beta": "assistants=v2", "x-request-id": "r-1",
         "cookie": "session=abc", "anthropic-dangerous-direct-browser-access": "true"}  # fmt: skip


def _openai_call(base: str, key: str, **options: Any) -> None:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, **options)
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], extra_headers=EXTRA)


def _anthropic_call(base: str, key: str, **options: Any) -> None:
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, **options)
    client.messages.create(model="claude-3-5-haiku-latest", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                           extra_headers=EXTRA)  # fmt: skip


def _beta_call(base: str, key: str) -> None:
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    client.beta.messages.create(model="claude-3-5-haiku-latest", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                                betas=["files-api-2025-04-14"])  # fmt: skip


CASES: dict[str, Callable[[str, str], None]] = {
    "openai defaults": lambda base, key: _openai_call(base, key),
    "openai organization and project": lambda base, key: _openai_call(base, key, organization="org-gw", project="proj-gw"),
    "anthropic defaults": lambda base, key: _anthropic_call(base, key),
    "anthropic default_headers beta": lambda base, key: _anthropic_call(base, key, default_headers={"anthropic-beta": "mcp-client-2025-04-04"}),
    "anthropic betas=": _beta_call,
}  # fmt: skip


def _sent(call: Callable[[str, str], None]) -> dict[str, str]:
    """The headers the SDK puts on the wire, read by a server of its own."""
    direct = Upstream()
    with serving(direct.app()) as url:
        call(url, KEYS["acme"])
    return direct.calls[-1]["headers"]


@pytest.mark.parametrize("case", CASES)
def test_only_the_allow_listed_client_headers_reach_the_upstream(gateway, upstream, case):
    sent = _sent(CASES[case])
    with gateway() as g:
        CASES[case](g.url, KEYS["acme"])
    arrived = upstream.calls[-1]["headers"]
    dropped = {name for name in sent if name not in FORWARDED | TRANSPORT | {"authorization", "x-api-key"}}
    assert dropped >= set(EXTRA) or case == "anthropic betas=", dropped  # the named ones are among those dropped
    for name, value in sent.items():
        if name in FORWARDED:
            assert arrived.get(name) == value, name  # unchanged
        elif name not in TRANSPORT:
            assert name not in arrived or name in ("authorization", "x-api-key"), f"{name} reached the upstream"
    assert set(arrived) <= FORWARDED | TRANSPORT | {"authorization", "x-api-key"}, set(arrived) - FORWARDED - TRANSPORT
    key = arrived.get("x-api-key") or arrived["authorization"].removeprefix("Bearer ")
    assert key == UPSTREAM_KEY and KEYS["acme"] not in arrived.values()
    if "anthropic" in case:
        assert arrived["anthropic-version"] == sent["anthropic-version"]  # the API's version: the client's to choose


def test_the_named_headers_never_reach_the_upstream(gateway, upstream):
    named = {"openai-organization": "org-x", "openai-project": "proj-x", "anthropic-beta": "computer-use-2025-01-24",
             "idempotency-key": "k"}  # fmt: skip
    with gateway() as g, g.client(headers=named) as c:
        assert c.post("/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
        assert c.post("/v1/messages", json={"model": "claude-3-5-haiku-latest", "max_tokens": 5,
                                            "messages": [{"role": "user", "content": "hi"}]}).status_code == 200  # fmt: skip
        assert c.get("/v1/models").status_code == 200  # the allow-listed passthrough too
    assert len(upstream.calls) == 3
    for call in upstream.calls:
        assert not set(named) & set(call["headers"]), call["path"]


def test_an_operator_may_forward_a_header_by_name(gateway, upstream):
    ups = {"anthropic": {"base_url": upstream.url, "api_key_env": "GW_TEST_UPSTREAM_KEY", "forward_headers": ["Anthropic-Beta"]}}
    with gateway(upstreams=ups) as g:
        _beta_call(g.url, KEYS["acme"])
    assert upstream.calls[-1]["headers"]["anthropic-beta"] == "files-api-2025-04-14"


@pytest.mark.parametrize("name", ["authorization", "X-Api-Key", "host", "x-lowtide-defer", "bad name"])
def test_a_forwarded_header_that_carries_a_key_or_framing_is_refused_in_the_config(name):
    from pydantic import ValidationError

    from lowtide.server.gateway.config import Upstream as UpstreamConfig

    with pytest.raises(ValidationError, match="never forwarded|not a header name"):
        UpstreamConfig(base_url="https://api.example.com", forward_headers=[name])
