"""Generated from the official SDKs' request types, so a parameter they add next is covered
the day they ship it: every key of the chat completions, responses, completions and
Anthropic messages create params goes through `lowtide serve`, as a batch line and in real
time, and either reaches an upstream of its protocol exactly as sent or, on lowtide's own
`echo`, is honoured or refused naming that very key and the route (DESIGN invariant 8)."""

from __future__ import annotations

import json

import httpx
import pytest

from lowtide.core.endpoints import CHAT, COMPLETIONS, MESSAGES, NEVER, RESPONSES, known_keys
from lowtide.routes.own.echo import HONOURS
from lowtide.routes.own.plain import BASE_KEYS
from lowtide.server.translate import scalar_checks
from tests.server.conftest import file_lines, upload, wait_anthropic, wait_openai

BASE = {
    CHAT: {"messages": [{"role": "user", "content": "hi"}]},
    RESPONSES: {"input": "hi"},
    COMPLETIONS: {"prompt": "hi"},
    MESSAGES: {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
}
CANDIDATES = (1, 0.5, "x", True, ["x"])  # for keys whose SDK type is plain


def value_for(endpoint: str, key: str):
    """A value of the key's SDK type where serve checks it; else an object nobody else would
    send, which an upstream must still get unchanged (serve does not judge richer types)."""
    check = scalar_checks(endpoint).get(key)
    if check is None:
        return {"lowtide-probe": key}
    for value in CANDIDATES:
        try:
            check.validate_python(value)
            return value
        except ValueError:
            continue
    raise AssertionError(f"no plain value fits {endpoint} {key}")


def probes(endpoint: str) -> dict[str, dict]:
    """One body per key of the endpoint's SDK type (beyond model and the base), by key."""
    keys = sorted(known_keys(endpoint) - NEVER - {"model"} - set(BASE[endpoint]))
    assert len(keys) > 10, keys  # the SDK's type was read, not an empty set
    return {key: {"model": "m-asked", **BASE[endpoint], key: value_for(endpoint, key)} for key in keys}


def line_id(key: str) -> str:
    return key.replace(".", "-")


def openai_batch(client, endpoint: str, bodies: dict[str, dict]):
    lines = [{"custom_id": line_id(k), "method": "POST", "url": endpoint, "body": b} for k, b in bodies.items()]
    file = upload(client, lines)
    done = wait_openai(client, client.batches.create(input_file_id=file.id, endpoint=endpoint, completion_window="24h").id)
    out = {x["custom_id"]: x for x in file_lines(client, done.output_file_id)}
    errors = {x["custom_id"]: x["response"]["body"]["error"] for x in file_lines(client, done.error_file_id)}
    return out, errors


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES, COMPLETIONS])
def test_every_sdk_key_reaches_an_openai_compatible_upstream_unchanged(serve, capture, endpoint):
    bodies = probes(endpoint)
    with serve(backend="openai-compatible", route_options={"base_url": capture.url, "concurrency": 4}) as s:
        out, errors = openai_batch(s.openai(), endpoint, bodies)
        assert not errors and len(out) == len(bodies)
        seen_batch = list(capture.bodies)
        del capture.bodies[:]
        for key, body in bodies.items():  # and in real time
            answer = httpx.post(f"{s.url}{endpoint}", json=body)
            assert answer.status_code == 200, (key, answer.text)
    for seen in (seen_batch, capture.bodies):
        assert sorted(map(json.dumps, map(_sorted, seen))) == sorted(map(json.dumps, map(_sorted, bodies.values())))


def test_every_sdk_key_reaches_an_anthropic_upstream_unchanged(serve, capture, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    bodies = probes(MESSAGES)
    with serve(backend="anthropic", route_options={"base_url": capture.url.removesuffix("/v1"), "concurrency": 4}) as s:
        client = s.anthropic()
        batch = client.messages.batches.create(requests=[{"custom_id": line_id(k), "params": b} for k, b in bodies.items()])
        done = wait_anthropic(client, batch.id)
        results = {r.custom_id: r.result for r in client.messages.batches.results(done.id)}
        assert {r.type for r in results.values()} == {"succeeded"}, {k: r for k, r in results.items() if r.type != "succeeded"}
        message = results[line_id(sorted(bodies)[0])].message
        assert message.model == "m-asked" and [(b.type, b.text) for b in message.content] == [("text", "done")]  # the upstream's whole answer (no tools asked: none called)
        seen_batch = list(capture.bodies)
        del capture.bodies[:]
        for key, body in bodies.items():
            answer = httpx.post(f"{s.url}/v1/messages", json=body)
            assert answer.status_code == 200, (key, answer.text)
    for seen in (seen_batch, capture.bodies):
        assert sorted(map(json.dumps, map(_sorted, seen))) == sorted(map(json.dumps, map(_sorted, bodies.values())))


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES, COMPLETIONS, MESSAGES])
def test_on_echo_every_sdk_key_is_honoured_or_refused_by_name(server, endpoint):
    bodies = probes(endpoint)
    honoured = {k for k in bodies if k in BASE_KEYS[endpoint] | HONOURS[endpoint]}
    plain = {k for k in honoured if k in scalar_checks(endpoint)}  # a probe object may be refused as a value
    if endpoint == MESSAGES:
        client = server.anthropic()
        batch = client.messages.batches.create(requests=[{"custom_id": line_id(k), "params": b} for k, b in bodies.items()])
        results = {r.custom_id: r.result for r in client.messages.batches.results(wait_anthropic(client, batch.id).id)}
        ran = {k for k in bodies if results[line_id(k)].type == "succeeded"}
        said = {k: results[line_id(k)].error.error.message for k in bodies if k not in ran}
        params = dict.fromkeys(said)
    else:
        out, errors = openai_batch(server.openai(), endpoint, bodies)
        ran = {k for k in bodies if line_id(k) in out}
        said = {k: errors[line_id(k)]["message"] for k in bodies if k not in ran}
        params = {k: errors[line_id(k)]["param"] for k in said}
    assert plain <= ran <= honoured and plain
    for key, message in said.items():  # the key itself, or a field inside its probe object
        field = message.split(":", 1)[0]
        assert field == key or field.startswith((f"{key}.", f"{key}[")), (key, message)
        assert message.endswith("(route echo)"), (key, message)
        assert params[key] in (None, field) if endpoint == MESSAGES else params[key] == field
    path = {CHAT: "/v1/chat/completions", RESPONSES: "/v1/responses", COMPLETIONS: "/v1/completions", MESSAGES: "/v1/messages"}[endpoint]
    for key, body in bodies.items():  # real time agrees
        answer = httpx.post(f"{server.url}{path}", json=body)
        assert (answer.status_code == 200) == (key in ran), (key, answer.text)


def _sorted(body: dict) -> dict:
    return json.loads(json.dumps(body, sort_keys=True))
