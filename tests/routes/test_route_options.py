"""Every option of every route, given a value it cannot use, is refused naming
`route_options.<key>`: never a crash with a bare ValueError, and never silently read as
something else. The options come from the routes' own lists, so a new one is tried the day
it is added."""

from __future__ import annotations

import sys

import pytest

from lowtide.core.errors import RouteError
from lowtide.routes import _entry_points, create_route, known_routes

# Values no option takes as they are: a bool or a float where a count goes, text where a
# number or a list goes, a number where text goes.
BAD = ["x", True, 2.5, float("nan"), -1, [1], {"a": 1}]
# Enough for each route to be built at all (its key, its server), so the option is what is judged.
BASE = {
    "openai-compatible": {"base_url": "http://127.0.0.1:9/v1"},
    "openai-compatible-batch": {"base_url": "http://127.0.0.1:9/v1"},
    "azure-batch": {"endpoint": "http://127.0.0.1:9"},
    "vertex-batch": {"staging": "gs://b/lowtide", "project": "p", "anonymous": True, "base_url": "http://127.0.0.1:9"},
    "bedrock-batch": {"role_arn": "arn:aws:iam::123456789012:role/B", "staging": "s3://bkt/lowtide", "region": "us-east-1"},
    "digitalocean-batch": {"api_key_env": "OPENAI_API_KEY"},  # a key the test sets (MODEL_ACCESS_KEY is not among them)
}


def route_options(route: str) -> list[str]:
    """The option names the route's module lists (every module-level `*OPTIONS` collection)."""
    module = sys.modules[_entry_points()[route].load().__module__]
    lists = [v for k, v in vars(module).items() if k.endswith("OPTIONS") and isinstance(v, set | frozenset | tuple)]
    return sorted(set().union(*lists) - {"api_key_env"})  # tests/engine/test_bad_input.py tries that one


CASES = [(route, key) for route in known_routes() for key in route_options(route)]


def test_every_route_lists_its_options():
    listed = {route for route, _ in CASES}
    assert listed >= {"echo", "echo-batch", "openai", "openai-batch", "anthropic", "anthropic-batch", "gemini-batch", "local"}


@pytest.mark.parametrize(("route", "key"), CASES, ids=[f"{r}.{k}" for r, k in CASES])
def test_an_option_refuses_a_value_it_cannot_use_by_name(route, key, monkeypatch):
    for env in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "AZURE_OPENAI_API_KEY", "MISTRAL_API_KEY", "OPENROUTER_API_KEY"):
        monkeypatch.setenv(env, "test-key-not-real")
    for env, value in {"AWS_ACCESS_KEY_ID": "AKIATESTTESTTEST", "AWS_SECRET_ACCESS_KEY": "test-key-not-real",
                       "AWS_EC2_METADATA_DISABLED": "true"}.items():  # bedrock-batch's credentials: no metadata lookups
        monkeypatch.setenv(env, value)
    taken = []
    for bad in BAD:
        options = BASE.get(route, {}) | {key: bad}
        try:
            create_route(route, options)
        except RouteError as err:
            assert f"route_options.{key}" in str(err) or f"{key}" in str(err), (bad, str(err))
        except Exception as err:  # noqa: BLE001 - the point: anything but a RouteError is a defect
            pytest.fail(f"{route}: route_options.{key} = {bad!r} crashed: {type(err).__name__}: {err}")
        else:
            taken.append(bad)
    assert taken != BAD, f"{route}: route_options.{key} took every one of {BAD}"
