"""A batch route makes its SDK client on first use (routes/base.py LazyClient): the loader
makes a route per lane at every load only to ask it what it refuses, and an SDK client costs
30-90 ms to make (its HTTP client loads the CA bundle). Options are refused as before, when
the route is made."""

from __future__ import annotations

import asyncio

import pytest

from lowtide.core.errors import RouteError
from lowtide.routes import create_route

ROUTES = {"openai-batch": "OPENAI_API_KEY", "anthropic-batch": "ANTHROPIC_API_KEY", "gemini-batch": "GEMINI_API_KEY"}


@pytest.mark.parametrize("name", ROUTES)
def test_a_route_made_to_be_asked_builds_no_client_and_closes_without_one(name, monkeypatch):
    monkeypatch.setenv(ROUTES[name], "test-key")
    route = create_route(name, {"base_url": "http://127.0.0.1:9"})
    assert route.made_client() is None
    asyncio.run(route.aclose())
    assert route.made_client() is None  # closing did not make one only to close it
    client = route.client
    assert route.made_client() is client and route.client is client  # made once, then kept
    asyncio.run(route.aclose())


@pytest.mark.parametrize("name", ROUTES)
def test_a_bad_option_of_the_client_is_still_refused_when_the_route_is_made(name, monkeypatch):
    monkeypatch.setenv(ROUTES[name], "test-key")
    with pytest.raises(RouteError, match="timeout"):
        create_route(name, {"timeout": "soon"})
