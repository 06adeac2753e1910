"""Urgent requests are forwarded as they are; deferrable ones are stored and answered 202.
Decided by header, by rule, by the classifier hook — in that order."""

from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import anthropic
import openai
import pytest

from lowtide.server.gateway import RequestInfo, Verdict

from .conftest import KEYS, UPSTREAM_KEY, base_config, running_gateway, serving, wait_until

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello there"}]}
MESSAGE = {"model": "claude-haiku-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hello there"}]}


def test_an_urgent_request_is_forwarded_with_the_upstream_key(gateway, upstream):
    with gateway() as g, g.client() as c:
        r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
    assert r.headers["x-lowtide-decision"] == "realtime"
    assert r.json()["choices"][0]["message"]["content"] == "upstream: hello there"
    sent = upstream.calls[-1]["headers"]
    assert sent["authorization"] == f"Bearer {UPSTREAM_KEY}"  # the client's key is replaced
    assert KEYS["acme"] not in str(sent)


def test_anthropic_messages_are_forwarded_with_x_api_key(gateway, upstream):
    with gateway() as g:
        client = anthropic.Anthropic(base_url=g.url, api_key=KEYS["acme"], max_retries=0)
        message = client.messages.create(**MESSAGE)
    assert message.content[0].text == "upstream: hello there"
    sent = upstream.calls[-1]["headers"]
    assert sent["x-api-key"] == UPSTREAM_KEY and "authorization" not in sent
    assert sent["anthropic-version"]  # the client's own headers go along


def test_defer_header_answers_202_and_the_result_comes_in_the_apis_shape(gateway, upstream):
    with gateway() as g, g.client() as c:
        r = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "10m"})
        assert r.status_code == 202
        accepted = r.json()
        assert accepted["decision"] == "deferred" and accepted["status"] == "accepted"
        assert r.headers["location"] == accepted["status_url"] == f"/v1/deferred/{accepted['id']}"  # no public_url: relative
        assert accepted["deadline_at"] == pytest.approx(accepted["created_at"] + 600)
        assert accepted["created_at"] <= accepted["expected_completion_at"] <= accepted["deadline_at"]
        done = g.wait_done(accepted["id"])
    assert upstream.calls == []  # never went real time
    assert done["status"] == "succeeded" and done["response_status"] == 200
    completion = openai.types.chat.ChatCompletion.model_validate(done["response"])
    assert completion.choices[0].message.content == "hello there"  # the echo route answered
    assert completion.usage.total_tokens > 0


def test_anthropic_deferred_result_is_a_message(gateway):
    with gateway() as g, g.client() as c:
        r = c.post("/v1/messages", json=MESSAGE, headers={"X-Lowtide-Defer": "1h"})
        assert r.status_code == 202
        done = g.wait_done(r.json()["id"])
    message = anthropic.types.Message.model_validate(done["response"])
    assert message.content[0].text == "hello there" and message.stop_reason == "end_turn"
    assert message.usage.service_tier is None  # echo's own answer, as it came: the gateway invents no tier


def test_priority_realtime_wins_over_a_rule(gateway, upstream):
    rules = [{"match": {"tenant": "acme"}, "action": "defer", "max_wait": "6h"}]
    with gateway(rules=rules) as g, g.client() as c:
        by_rule = c.post("/v1/chat/completions", json=CHAT)
        urgent = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Priority": "realtime"})
    assert by_rule.status_code == 202 and by_rule.json()["deadline_at"] == pytest.approx(by_rule.json()["created_at"] + 6 * 3600)
    assert urgent.status_code == 200 and len(upstream.calls) == 1


@pytest.mark.parametrize(
    "match, headers, body, deferred",
    [
        ({"model": "gpt-4o*"}, {}, {}, True),
        ({"model": "claude-*"}, {}, {}, False),
        ({"tag": "nightly"}, {"X-Lowtide-Tag": "eval, nightly"}, {}, True),
        ({"tag": "nightly"}, {"X-Lowtide-Tag": "eval"}, {}, False),
        ({"metadata": {"team": "ml"}}, {}, {"metadata": {"team": "ml"}}, True),
        ({"path": "/v1/messages"}, {}, {}, False),
        ({"tenant": "globex"}, {}, {}, False),
    ],
)
def test_rules_match_by_model_tag_metadata_path_and_tenant(gateway, upstream, match, headers, body, deferred):
    # A batch route that takes `metadata` (echo honours plain text only, and would refuse it).
    batch = {"openai": {"route": "openai", "fallback": "none",
                        "route_options": {"base_url": f"{upstream.url}/v1", "api_key_env": "GW_TEST_UPSTREAM_KEY"}}}  # fmt: skip
    with gateway(rules=[{"match": match, "action": "defer"}], batch=batch) as g, g.client() as c:
        r = c.post("/v1/chat/completions", json={**CHAT, **body}, headers=headers)
    assert r.status_code == (202 if deferred else 200)


def test_the_classifier_hook_decides_when_no_header_or_rule_does(gateway, upstream):
    seen: list[RequestInfo] = []

    def classify(info: RequestInfo):
        seen.append(info)
        if "report" in info.body["messages"][-1]["content"]:
            return Verdict("defer", 3600)
        if "boom" in info.body["messages"][-1]["content"]:
            raise RuntimeError("classifier bug")
        return None

    with gateway(classifier=classify) as g, g.client() as c:
        report = c.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "weekly report"}]})
        plain = c.post("/v1/chat/completions", json=CHAT)
        broken = c.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "boom"}]})
        header = c.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "report"}]},
                        headers={"X-Lowtide-Priority": "realtime"})
    assert report.status_code == 202
    assert plain.status_code == 200 and broken.status_code == 200 and header.status_code == 200
    assert len(seen) == 3  # the header decided the last one: the hook was not asked
    assert seen[0].tenant == "acme" and "authorization" not in seen[0].headers  # the hook never sees the key


def test_a_body_the_batch_route_refuses_is_a_400_if_it_must_wait_and_real_time_if_it_may(gateway, upstream):
    with gateway() as g, g.client() as c:  # the batch target is echo, which honours no logprobs
        must = c.post("/v1/chat/completions", json={**CHAT, "logprobs": True}, headers={"X-Lowtide-Defer": "1h"})
        may = c.post("/v1/chat/completions", json={**CHAT, "logprobs": True},
                     headers={"X-Lowtide-Defer": "1h", "X-Lowtide-Prefer": "realtime"})  # fmt: skip
    assert must.status_code == 400 and must.json()["error"]["param"] == "logprobs"
    assert "logprobs" in must.json()["error"]["message"] and "route echo" in must.json()["error"]["message"]
    assert may.status_code == 200 and may.headers["x-lowtide-decision"] == "realtime"
    assert "logprobs" in may.headers["x-lowtide-reason"] and "route echo" in may.headers["x-lowtide-reason"]
    assert [call["body"]["logprobs"] for call in upstream.calls] == [True]  # only the one that may go real time went


def test_a_refused_deferred_call_is_told_its_fix_in_its_own_terms(gateway):
    """The 400 said "remove it to defer this call" whatever the refusal: of an Anthropic call
    without max_tokens (which the batch route requires) too, the one key it must add."""
    batch = {"anthropic": {"route": "anthropic-batch", "fallback": "none", "route_options": {"api_key_env": "GW_TEST_UPSTREAM_KEY"}}}
    message = {"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "later"}]}
    with gateway(batch=batch) as g, g.client() as c:
        missing = c.post("/v1/messages", json=message, headers={"X-Lowtide-Defer": "1h"})
        extra = c.post("/v1/chat/completions", json={**CHAT, "logprobs": True}, headers={"X-Lowtide-Defer": "1h"})
    said = missing.json()["error"]["message"]
    assert missing.status_code == 400 and said.startswith("max_tokens: ")
    assert said.endswith("; add max_tokens to the body to defer this call, or send it with X-Lowtide-Priority: realtime to run it now")
    assert extra.json()["error"]["message"].endswith("; change or remove logprobs to defer this call, or send it with X-Lowtide-Priority: realtime to run it now")


def test_a_model_outside_the_batch_mapping_is_not_deferred(gateway):
    batch = {"openai": {"route": "echo", "models": {"gpt-4o": "gpt-4o"}}}
    with gateway(batch=batch) as g, g.client() as c:
        r = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "1h"})
    assert r.status_code == 200 and "models" in r.headers["x-lowtide-reason"]


@pytest.mark.parametrize("headers", [{"X-Lowtide-Defer": "soon"}, {"X-Lowtide-Priority": "whenever"}, {"X-Lowtide-Defer": "1h", "X-Lowtide-Prefer": "x"}])
def test_bad_lowtide_headers_are_refused_naming_the_header(gateway, headers):
    with gateway() as g, g.client() as c:
        r = c.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert r.status_code == 400
    assert list(headers)[-1].lower() in r.json()["error"]["message"].lower()


def test_streaming_passes_through_to_the_openai_sdk_chunk_by_chunk(gateway, upstream):
    with gateway() as g:
        client = openai.OpenAI(base_url=f"{g.url}/v1", api_key=KEYS["acme"], max_retries=0)
        chunks = list(client.chat.completions.create(model="gpt-4o-mini", messages=CHAT["messages"], stream=True))
        client.chat.completions.create(model="gpt-4o-mini", messages=CHAT["messages"])
        up = g.gw.upstreams["openai"]
        wait_until(lambda: g.gw.loads["openai"].in_flight == 0 and up.gate._value == up.config.max_connections,
                   what="every forwarded request to be counted done")
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "upstream: hello there"
    assert len(chunks) == 4 and chunks[-1].choices[0].finish_reason == "stop"


def test_streaming_passes_through_to_the_anthropic_sdk(gateway):
    with gateway() as g:
        client = anthropic.Anthropic(base_url=g.url, api_key=KEYS["acme"], max_retries=0)
        with client.messages.stream(**MESSAGE) as stream:
            text = "".join(stream.text_stream)
    assert text.strip() == "upstream: hello there"


def test_other_api_calls_pass_through(gateway, upstream):
    with gateway() as g:
        client = openai.OpenAI(base_url=f"{g.url}/v1", api_key=KEYS["acme"], max_retries=0)
        models = client.models.list()
    assert [m.id for m in models] == ["gpt-4o-mini"]
    assert upstream.calls[-1]["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"


def test_an_unreachable_upstream_is_a_502(gateway, tmp_path):
    upstreams = {"openai": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "GW_TEST_UPSTREAM_KEY"}}
    with gateway(upstreams=upstreams) as g, g.client() as c:
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 502
        assert g.gw.loads["openai"].in_flight == 0


def test_an_encoded_upstream_answer_reaches_the_client_readable(tmp_path):
    """httpx hands the gateway a gzip answer decoded; it must not go on saying it is gzip."""
    models = json.dumps({"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}]}).encode()

    async def gzipping(scope, receive, send):
        if scope["type"] != "http":
            return
        body = gzip.compress(models)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-encoding", b"gzip"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    with serving(gzipping) as up, running_gateway(tmp_path, base_config(tmp_path, SimpleNamespace(url=up))) as g:
        client = openai.OpenAI(base_url=f"{g.url}/v1", api_key=KEYS["acme"], max_retries=0)
        assert [m.id for m in client.models.list()] == ["gpt-4o-mini"]
        assert client.chat.completions.with_raw_response.create(**CHAT).http_response.headers.get("content-encoding") is None
