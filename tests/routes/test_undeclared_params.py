"""Parameters the installed SDK does not declare (issue 33, item 6), for every top-level key a
release of the openai or anthropic SDK from the last 12 months declared
(tests/data/sdk_params_history.json, written by tests/data/make_sdk_params_history.py):

- on a route that sends the body to a provider of its own protocol unchanged, the key is
  carried: not refused, and in the line or call body as it came;
- where lowtide translates the body (chat completions to Anthropic or Gemini) or runs it
  itself (echo), it is honoured or refused by name: never dropped, never refused by another
  field's name.

A key the installed SDK does not declare (one of an older release, or a made-up future one)
passes the spec's check on a carrying route and is noted once per job as an event."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from sqlalchemy import select

from lowtide.core import shapes
from lowtide.core.endpoints import (
    CHAT,
    EMBEDDINGS,
    ENGINE_EXTRAS,
    MESSAGES,
    NEVER,
    RESPONSES,
    body_type,
    known_keys,
)
from lowtide.core.spec import check_params
from lowtide.core.types import Request
from lowtide.engine.carried import CarriedKeys
from lowtide.routes import create_route
from lowtide.routes.anthropic.batch import batch_request
from lowtide.routes.openai.batch import request_line
from lowtide.store.db import Store
from lowtide.store.schema import events

HISTORY = json.loads((Path(__file__).parents[1] / "data" / "sdk_params_history.json").read_text())
KEY_ENV = "LOWTIDE_TEST_PROVIDER_KEY"
NOWHERE = "http://127.0.0.1:9"  # no request is made: routes are only asked what they refuse
FUTURE = "a_parameter_no_sdk_declares_yet"
BASE = {
    CHAT: {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
    RESPONSES: {"model": "gpt-4o-mini", "input": "hi"},
    "/v1/completions": {"model": "gpt-3.5-turbo-instruct", "prompt": "hi"},
    EMBEDDINGS: {"model": "text-embedding-3-small", "input": "hi"},
    MESSAGES: {"model": "claude-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
}
OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens")
SAME_PROTOCOL = {"openai": ("openai-batch", "openai", "openai-compatible"), "anthropic": ("anthropic-batch", "anthropic")}


def _cases(sdk: str) -> list[tuple[str, str]]:
    return [
        (endpoint, key)
        for endpoint, keys in HISTORY["sdks"][sdk]["endpoints"].items()
        for key in keys
        if key not in BASE[endpoint] and key not in NEVER
    ]


OPENAI = _cases("openai")
ANTHROPIC = _cases("anthropic")


@pytest.fixture
def routes(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")
    made = {}

    def route(name: str):
        if name not in made:
            url = NOWHERE + ("/v1" if name.startswith("openai") else "")
            made[name] = create_route(name, {} if name == "echo" else {"base_url": url, "api_key_env": KEY_ENV})
        return made[name]

    return route


def sample(endpoint: str, key: str):
    """A plain value of the installed SDK's type for `key` (1 where it declares none): the
    first Literal, a number, text, an empty list or object."""
    entry = shapes.fields(body_type(endpoint)).get(key)
    if entry is None:
        return 1
    for arm in shapes.arms(entry[0]):
        arm = shapes.unwrap(arm)
        if arm is type(None):
            continue
        if typing.get_origin(arm) is typing.Literal:
            return typing.get_args(arm)[0]
        if arm in (bool, int, float, str):
            return {bool: True, int: 1, float: 0.5, str: "x"}[arm]
        return {"a list": [], "an object": {}}.get(shapes.said(arm), 1)
    return 1


def _by_name(refused, key: str) -> bool:
    """Whether a refusal names `key` (itself, or a path into it)."""
    return refused.field.split(".")[0].split("[")[0] == key


def test_the_history_covers_both_sdks_and_a_year_of_releases():
    for sdk, endpoints in (("openai", (CHAT, RESPONSES, EMBEDDINGS)), ("anthropic", (MESSAGES,))):
        found = HISTORY["sdks"][sdk]
        assert set(endpoints) <= set(found["endpoints"]) and found["releases"]["in_window"] >= 2
    assert ("/v1/messages", "temperature") in ANTHROPIC and (CHAT, "temperature") in OPENAI


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_every_key_a_recent_sdk_declared_is_carried_on_its_own_protocols_routes(routes, sdk):
    for endpoint, key in (OPENAI if sdk == "openai" else ANTHROPIC) + [(e, FUTURE) for e in BASE if e != MESSAGES or sdk == "anthropic"]:
        if (endpoint == MESSAGES) != (sdk == "anthropic"):
            continue
        body = BASE[endpoint] | {key: 1}
        for name in SAME_PROTOCOL[sdk]:
            refused = routes(name).refusal(Request("r-1", endpoint, body))
            assert refused is None, f"{name} {endpoint} `{key}`: {refused}"
        request = Request("r-1", endpoint, body)
        sent = request_line(request)["body"] if sdk == "openai" else batch_request(request, False)["params"]
        assert sent[key] == 1, f"{endpoint} `{key}` is not in the batch line"


def test_every_chat_key_is_translated_or_refused_by_name_on_anthropic_and_gemini(routes, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    for _, key in [c for c in OPENAI if c[0] == CHAT] + [(CHAT, FUTURE)]:
        body = BASE[CHAT] | ({} if key in OUTPUT_LIMITS else {"max_tokens": 16}) | {key: sample(CHAT, key)}
        for name in ("anthropic", "anthropic-batch", "gemini", "gemini-batch"):
            refused = routes(name).refusal(Request("r-1", CHAT, body))
            assert refused is None or _by_name(refused, key), f"{name} chat `{key}`: refused as {refused}"


def test_every_key_is_honoured_or_refused_by_name_where_lowtide_runs_it(routes):
    for endpoint, key in OPENAI + ANTHROPIC + [(e, FUTURE) for e in BASE]:
        refused = routes("echo").refusal(Request("r-1", endpoint, BASE[endpoint] | {key: sample(endpoint, key)}))
        assert refused is None or _by_name(refused, key), f"echo {endpoint} `{key}`: refused as {refused}"
    assert _by_name(routes("echo").refusal(Request("r-1", MESSAGES, BASE[MESSAGES] | {FUTURE: 1})), FUTURE)


def test_the_spec_takes_an_undeclared_key_on_a_carrying_route_and_refuses_it_by_name_elsewhere():
    # (Self-hosted engines' own keys, top_k among them, pass the spec on any route: the
    # route's refusal is their check.)
    undeclared = [k for e, k in ANTHROPIC if k not in known_keys(MESSAGES) | ENGINE_EXTRAS] + [FUTURE]
    assert "temperature" in undeclared or "temperature" in known_keys(MESSAGES)
    for key in undeclared:
        assert check_params({key: 1, "max_tokens": 16}, MESSAGES, route="anthropic-batch")[key] == 1
        with pytest.raises(ValueError, match=f'"{key}" is not a parameter of /v1/messages'):
            check_params({key: 1, "max_tokens": 16}, MESSAGES, route="echo")


def test_a_carried_key_is_noted_once_per_job_and_key(tmp_path):
    from lowtide.core.spec import build_spec
    from tests.conftest import write_csv

    source = write_csv(tmp_path / "rows.csv", [{"id": "1", "text": "hi"}])
    spec = build_spec({
        "name": "carry", "source": {"path": str(source), "id_column": "id"}, "template": {"user": "{{ text }}"},
        "model": "claude-haiku-4-5", "route": "anthropic-batch", "params": {"max_tokens": 16, FUTURE: 0.5},
    })  # fmt: skip
    carried = CarriedKeys(spec)
    for _ in range(3):
        carried.see(BASE[MESSAGES] | {FUTURE: 0.5})
    store = Store(str(tmp_path / "lowtide.db"))
    with store.begin() as conn:
        carried.note(conn, 1, 0.0)
        carried.note(conn, 1, 1.0)  # a second load of the same job says nothing new
        said = conn.execute(select(events.c.kind, events.c.message)).all()
    assert len(said) == 1 and said[0].kind == "carried_param"
    assert said[0].message.startswith(f"`{FUTURE}` is not a parameter of /v1/messages as the installed SDK (anthropic ")
    assert "anthropic-batch sends it in the body as it is" in said[0].message
