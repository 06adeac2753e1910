"""A deferred call reaches the batch route's provider as it was sent, or is refused at the
door naming the field and the route (DESIGN invariant 8); its result is the provider's whole
answer. The batch route is `openai-batch` pointed at a real `lowtide serve` on loopback, and
what it was sent is read back through the Files API (`files.content(batch.input_file_id)`),
so the check does not depend on what serve then does with each line."""

from __future__ import annotations

import json
import time
import types
import typing
from types import SimpleNamespace
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types.message_create_params import MessageCreateParamsBase
from openai.types.chat.completion_create_params import CompletionCreateParamsBase
from sqlalchemy import func, select

from lowtide.core.endpoints import NEVER
from lowtide.core.errors import SpecError
from lowtide.server.gateway import build_gateway_config
from lowtide.server.gateway.records import accepted_row, insert_accepted, new_deferred_id
from lowtide.store.gateway_schema import gateway_requests
from tests.server.conftest import running

from .conftest import KEYS, UPSTREAM_KEY, base_config, running_gateway, wait_until

DEFER = {"X-Lowtide-Defer": "1h"}
MESSAGES = [{"role": "user", "content": "extract the city"}]
TOOLS = [{"type": "function", "function": {"name": "city", "description": "the city named",
          "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, "strict": True}}]  # fmt: skip
RICH = {  # what the old gateway sent real time (tools, response_format) or rewrote (max_completion_tokens)
    "model": "gpt-4o-mini", "messages": MESSAGES, "tools": TOOLS,
    "tool_choice": {"type": "function", "function": {"name": "city"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": {"type": "object"}, "strict": True}},
    "seed": 7, "top_p": 0.9, "max_completion_tokens": 321, "parallel_tool_calls": False, "logprobs": True, "top_logprobs": 2,
}  # fmt: skip


def _batch_target(serve_url: str, **extra: Any) -> dict[str, Any]:
    options = {"base_url": f"{serve_url}/v1", "api_key_env": "GW_TEST_UPSTREAM_KEY", "poll_interval": [0.05, 0.2]}
    return {"openai": {"route": "openai-batch", "route_options": options, "fallback": "none", **extra}}


@pytest.fixture
def serve(tmp_path):
    """`lowtide serve` as the batch provider, knowing only the upstream key."""
    with running(tmp_path, db=str(tmp_path / "serve.db"), data_dir=tmp_path / "serve-data", api_keys=(UPSTREAM_KEY,)) as s:
        s.client = openai.OpenAI(base_url=f"{s.url}/v1", api_key=UPSTREAM_KEY, max_retries=0)
        yield s


def _sent_lines(serve, n: int) -> dict[str, dict[str, Any]]:
    """custom_id → the line as the batch route uploaded it, once `n` lines have been."""

    def lines() -> dict[str, dict[str, Any]] | None:
        found: dict[str, dict[str, Any]] = {}
        for batch in serve.client.batches.list():
            for line in serve.client.files.content(batch.input_file_id).text.splitlines():
                found.setdefault(json.loads(line)["custom_id"], json.loads(line))
        return found if len(found) >= n else None

    return wait_until(lines, what=f"{n} line(s) uploaded to the batch provider")


def _stored(g) -> int:
    with g.gw.store.begin() as conn:
        return conn.execute(select(func.count()).select_from(gateway_requests)).scalar_one()


def test_a_deferred_call_reaches_the_batch_provider_unchanged(tmp_path, upstream, serve):
    config = base_config(tmp_path, upstream, batch=_batch_target(serve.url))
    with running_gateway(tmp_path, config) as g, g.client() as c:
        plain = c.post("/v1/chat/completions", json=RICH, headers=DEFER)
        assert plain.status_code == 202, plain.text
        sdk = openai.OpenAI(base_url=f"{g.url}/v1", api_key=KEYS["acme"], max_retries=0)
        raw = sdk.chat.completions.with_raw_response.create(**RICH, extra_headers=DEFER)  # the SDK's own encoding
        assert raw.http_response.status_code == 202
        sent = _sent_lines(serve, 2)
    for gid in (plain.json()["id"], raw.http_response.json()["id"]):
        line = sent[gid]
        assert line["url"] == "/v1/chat/completions" and line["method"] == "POST"
        assert line["body"] == RICH  # every field, as it came: nothing dropped, rewritten or added
    assert "max_tokens" not in sent[plain.json()["id"]]["body"]  # no limit invented beside max_completion_tokens
    assert upstream.calls == []  # none of it went real time


def _sample(tp: Any) -> Any:
    """A JSON value of the SDK's declared type for a key (the first choice of each union)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Required, typing.NotRequired, typing.Annotated):
        return _sample(args[0])
    if origin in (typing.Union, types.UnionType):
        return _sample(next(a for a in args if a is not type(None)))
    if origin is typing.Literal:
        return args[0]
    if tp in (bool, int, float, str):
        return {bool: True, int: 1, float: 0.5, str: "x"}[tp]
    if typing.is_typeddict(tp):
        return {k: _sample(v) for k, v in typing.get_type_hints(tp).items() if k in tp.__required_keys__}
    if origin is dict or tp is object:
        return {"k": "v"}
    if origin is not None and args:  # Iterable / List / Sequence of one type
        return [_sample(args[0])]
    return "x"


CHAT_KEYS = sorted(set(CompletionCreateParamsBase.__required_keys__ | CompletionCreateParamsBase.__optional_keys__)
                   - {"model", "messages"} - NEVER)  # fmt: skip


def test_every_chat_parameter_the_sdk_declares_reaches_the_batch_provider_or_is_refused_by_name(tmp_path, upstream, serve, clock):
    """Generated from the SDK's own request type: the next key the SDK adds is tried too."""
    hints = typing.get_type_hints(CompletionCreateParamsBase, include_extras=True)
    asked = {key: {"model": "gpt-4o-mini", "messages": MESSAGES, key: _sample(hints[key])} for key in CHAT_KEYS}
    config = base_config(tmp_path, upstream, batch=_batch_target(serve.url), collector={"flush_age": 60})
    with running_gateway(tmp_path, config, clock=clock) as g, g.client() as c:
        answers = {key: c.post("/v1/chat/completions", json=body, headers=DEFER) for key, body in asked.items()}
        refused = {key: r for key, r in answers.items() if r.status_code == 400}
        for key, r in refused.items():
            assert r.json()["error"]["param"] == key and key in r.json()["error"]["message"], r.text
        accepted = {r.json()["id"]: key for key, r in answers.items() if r.status_code == 202}
        assert len(accepted) + len(refused) == len(asked), {k: r.status_code for k, r in answers.items()}
        clock.advance(61)  # one flush of them all
        g.gw.collector.wake()
        sent = _sent_lines(serve, len(accepted))
    for gid, key in accepted.items():
        assert sent[gid]["body"] == asked[key], key
    assert len(accepted) > 30  # openai-batch takes every key the SDK declares


MESSAGE_KEYS = sorted(set(MessageCreateParamsBase.__required_keys__ | MessageCreateParamsBase.__optional_keys__)
                      - {"model", "messages", "max_tokens"} - NEVER)  # fmt: skip


def test_every_messages_parameter_the_sdk_declares_reaches_the_anthropic_route_or_is_refused_by_name(gateway, upstream):
    """The same for Anthropic's request type, on the `anthropic` route (its real-time
    twin shares the batch route's refusal) pointed at the loopback upstream."""
    hints = typing.get_type_hints(MessageCreateParamsBase, include_extras=True)
    base = {"model": "claude-haiku-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    asked = {key: {**base, key: _sample(hints[key])} for key in MESSAGE_KEYS}
    batch = {"anthropic": {"route": "anthropic", "fallback": "none",
                           "route_options": {"base_url": upstream.url, "api_key_env": "GW_TEST_UPSTREAM_KEY"}}}  # fmt: skip
    with gateway(batch=batch) as g, g.client() as c:
        answers = {key: c.post("/v1/messages", json=body, headers=DEFER) for key, body in asked.items()}
        for key, r in answers.items():
            assert r.status_code == 202 or (r.status_code == 400 and key in r.json()["error"]["message"]), (key, r.text)
        accepted = {key: r.json()["id"] for key, r in answers.items() if r.status_code == 202}
        for gid in accepted.values():
            assert g.wait_done(gid)["status"] == "succeeded"
    arrived = sorted(json.dumps(call["body"], sort_keys=True) for call in upstream.calls)
    assert arrived == sorted(json.dumps(asked[key], sort_keys=True) for key in accepted)
    assert len(accepted) > 10


def test_a_key_the_sdk_does_not_declare_is_carried_and_a_stream_is_refused(tmp_path, upstream, serve):
    """A same-protocol batch route carries a key the installed SDK does not declare as it
    came (routes/openai/wire.py); what no batch can do (a stream) is a 400 naming it, not stored."""
    config = base_config(tmp_path, upstream, batch=_batch_target(serve.url))
    with running_gateway(tmp_path, config) as g, g.client() as c:
        carried = c.post("/v1/chat/completions", json={**RICH, "guided_json": {"type": "object"}}, headers=DEFER)
        streamed = c.post("/v1/chat/completions", json={**RICH, "stream": True}, headers=DEFER)
        stored = _stored(g)
        assert carried.status_code == 202, carried.text
        line = _sent_lines(serve, 1)[carried.json()["id"]]
    assert line["body"]["guided_json"] == {"type": "object"}
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "stream"
    assert stored == 1  # the streamed one was not
    assert upstream.calls == []  # nothing ran real time instead


def test_the_fallback_route_is_asked_too(tmp_path, upstream, serve):
    """A flush cuts over to its fallback near a deadline: a body the fallback cannot honour
    would fail its whole flush later, so it is refused now, naming the fallback."""
    batch = _batch_target(serve.url, fallback={"route": "echo"})
    with running_gateway(tmp_path, base_config(tmp_path, upstream, batch=batch)) as g, g.client() as c:
        r = c.post("/v1/chat/completions", json=RICH, headers=DEFER)
        fine = c.post("/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": MESSAGES}, headers=DEFER)
    assert r.status_code == 400 and "route echo" in r.json()["error"]["message"]
    assert fine.status_code == 202


def test_an_anthropic_body_reaches_its_route_verbatim_and_a_refusal_is_in_anthropics_shape(gateway, upstream):
    batch = {"anthropic": {"route": "anthropic", "fallback": "none",
                           "route_options": {"base_url": upstream.url, "api_key_env": "GW_TEST_UPSTREAM_KEY"}}}  # fmt: skip
    body = {"model": "claude-haiku-4-5", "max_tokens": 77, "messages": [{"role": "user", "content": "hi"}],
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "city", "input_schema": {"type": "object"}}], "tool_choice": {"type": "auto"},
            "metadata": {"user_id": "u-1"}, "stop_sequences": ["END"]}  # fmt: skip
    with gateway(batch=batch) as g, g.client() as c:
        r = c.post("/v1/messages", json=body, headers=DEFER)
        assert r.status_code == 202, r.text
        done = g.wait_done(r.json()["id"])
        carried = c.post("/v1/messages", json={**body, "frobnicate": 1}, headers=DEFER)
        assert carried.status_code == 202, carried.text
        g.wait_done(carried.json()["id"])
        sdk = anthropic.Anthropic(base_url=g.url, api_key=KEYS["acme"], max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="stream"):  # the SDK reads it as Anthropic's own 400
            sdk.messages.create(**body, stream=True, extra_headers=DEFER)
    # system blocks, cache_control, tools: as sent; a key the SDK does not declare carried as it came (routes/openai/wire.py)
    assert [call["body"] for call in upstream.calls] == [body, {**body, "frobnicate": 1}]
    assert done["status"] == "succeeded" and done["response"] == {
        "id": "msg_up", "type": "message", "role": "assistant", "model": body["model"], "stop_reason": "end_turn",
        "content": [{"type": "text", "text": "upstream: hi"}], "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 3}}  # fmt: skip


def test_the_callback_carries_the_providers_whole_response(tmp_path, upstream, receiver, serve):
    config = base_config(tmp_path, upstream, batch=_batch_target(serve.url))
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_completion_tokens": 50}
    with running_gateway(tmp_path, config) as g, g.client() as c:
        r = c.post("/v1/chat/completions", json=body, headers={**DEFER, "X-Lowtide-Callback": f"{receiver.url}/hook"})
        assert r.status_code == 202, r.text
        gid = r.json()["id"]
        wait_until(lambda: receiver.deliveries, what="the webhook")
        status = g.status(gid).json()
    batch = serve.client.batches.list().data[0]
    line = json.loads(serve.client.files.content(batch.output_file_id).text.splitlines()[0])
    assert line["custom_id"] == gid
    delivered = receiver.deliveries[0]["body"]
    assert delivered["status"] == "succeeded"
    assert delivered["response"] == line["response"]["body"] == status["response"]  # the provider's, not rebuilt
    assert delivered["response"]["id"] != f"chatcmpl-{gid}"


def test_a_direct_lanes_whole_answer_is_kept(gateway, upstream):
    """On a real-time route as the target (or the fallback near a deadline), the result is
    the upstream's body with everything in it (logprobs, system_fingerprint)."""
    batch = {"openai": {"route": "openai", "fallback": "none",
                        "route_options": {"base_url": f"{upstream.url}/v1", "api_key_env": "GW_TEST_UPSTREAM_KEY"}}}  # fmt: skip
    with gateway(batch=batch) as g, g.client() as c:
        r = c.post("/v1/chat/completions", json=RICH, headers=DEFER)
        assert r.status_code == 202, r.text
        done = g.wait_done(r.json()["id"])
    assert [call["body"] for call in upstream.calls] == [RICH]
    response = done["response"]
    assert response["system_fingerprint"] == "fp_upstream" and response["id"] == "chatcmpl-up"
    assert response["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.25


def test_a_limit_is_never_invented_and_stream_false_is_the_one_key_removed(tmp_path, upstream, serve):
    config = base_config(tmp_path, upstream, batch=_batch_target(serve.url))
    body = {"model": "gpt-4o-mini", "messages": MESSAGES}
    with running_gateway(tmp_path, config) as g, g.client() as c:
        bare = c.post("/v1/chat/completions", json=body, headers=DEFER).json()["id"]
        unstreamed = c.post("/v1/chat/completions", json={**body, "stream": False}, headers=DEFER).json()["id"]
        sent = _sent_lines(serve, 2)
    assert sent[bare]["body"] == sent[unstreamed]["body"] == body


def test_a_config_with_default_max_tokens_is_refused_saying_why(tmp_path, upstream):
    config = base_config(tmp_path, SimpleNamespace(url=upstream.url), batch={"openai": {"route": "echo", "default_max_tokens": 4096}})
    with pytest.raises(SpecError, match="default_max_tokens is gone"):
        build_gateway_config(config)


def test_a_request_an_older_gateway_accepted_still_runs_as_the_body_it_stood_for(gateway):
    """Rows stored before bodies were kept verbatim hold text turns and three parameters."""
    legacy = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "old one"}],
              "max_tokens": 16, "temperature": 1.0, "stop": ["END"]}  # fmt: skip
    with gateway() as g:
        gids = []
        for api, model in (("openai", "gpt-4o-mini"), ("anthropic", "claude-haiku-4-5")):
            gids.append(new_deferred_id())
            row = accepted_row(id=gids[-1], tenant="acme", api=api, model=model, decision="deferred", payload=json.dumps(legacy),
                               callback_url=None, accepted_at=time.time(), deadline_at=time.time() + 3600, expected_at=time.time())  # fmt: skip
            with g.gw.store.begin() as conn:
                insert_accepted(conn, [row])
        g.gw.collector.wake()
        done = [g.wait_done(gid) for gid in gids]
    assert [d["status"] for d in done] == ["succeeded", "succeeded"]
    assert done[0]["response"]["choices"][0]["message"]["content"] and done[1]["response"]["content"][0]["text"]


def test_a_body_without_a_model_goes_real_time_for_the_upstream_to_answer(gateway, upstream):
    with gateway() as g, g.client() as c:
        r = c.post("/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, headers=DEFER)
    assert r.headers["x-lowtide-decision"] == "realtime" and r.headers["x-lowtide-reason"] == "no model"
    assert len(upstream.calls) == 1
