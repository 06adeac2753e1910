"""Every parameter, message role and content part the official SDKs declare, through a job on
every route: it either reaches the provider unchanged (or by the one documented mapping, on
a route of the other protocol), or the request is refused before anything is stored, naming
the field and the route (DESIGN invariant 8).

The cases are generated from the SDKs' own request types (`lowtide.routes.support`): a key
the SDKs add next month becomes a case here without anyone writing it. The batch routes run
through `lowtide serve` in front of the same capture upstream (its openai-compatible and
anthropic backends), so serve's passthrough is checked by the same cases.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lowtide.core.clock import ManualClock
from lowtide.core.endpoints import CHAT, COMPLETIONS, GEMINI, MESSAGES, PROTOCOL, RESPONSES
from lowtide.core.sources import open_file
from lowtide.core.spec import build_spec
from lowtide.core.templates import MessageTemplate
from lowtide.engine.loader import Refused, RowRenderer, load_job
from lowtide.routes.support import (
    ROUTE_PROTOCOL,
    base_body,
    conversation_with,
    message_samples,
    param_samples,
)
from lowtide.store.db import Store
from lowtide.store.schema import requests
from tests.conformance.capture import capture, marker_of
from tests.conftest import drive_to_end
from tests.routes.conftest import _run

KEY_ENV = "LOWTIDE_CONFORMANCE_KEY"
# Where a chat completions key lands in the Anthropic body it is translated to (routes/anthropic/translate.py).
# A key the translation starts to map must be added here: the test fails until it is.
LANDS = {
    "max_completion_tokens": "max_tokens", "stop": "stop_sequences", "tools": "tools",
    "tool_choice": "tool_choice", "user": "metadata",
    "temperature": "temperature", "top_p": "top_p",  # the API takes both, declared by the SDK or not
    # Anthropic's own behaviour, so nothing to send: n 1 (one answer), parallel_tool_calls true
    # (false lands in tool_choice: tests/routes/test_translate.py).
    "n": None, "parallel_tool_calls": None,
    # The SDK's first format is text: Anthropic's own behaviour (json_schema lands in
    # output_config: tests/routes/test_native_structure.py).
    "response_format": None,
}  # fmt: skip


# Where a chat completions key lands in the Gemini body it is translated to (routes/gemini/wire.py):
# (a top-level key, the key inside it). The same rule: a newly mapped key fails until added.
GEMINI_LANDS = {
    "max_completion_tokens": ("generationConfig", "maxOutputTokens"), "temperature": ("generationConfig", "temperature"),
    "top_p": ("generationConfig", "topP"), "seed": ("generationConfig", "seed"), "n": ("generationConfig", "candidateCount"),
    "presence_penalty": ("generationConfig", "presencePenalty"), "frequency_penalty": ("generationConfig", "frequencyPenalty"),
    "stop": ("generationConfig", "stopSequences"), "response_format": ("generationConfig", "responseMimeType"),
}  # fmt: skip


def cases(endpoint: str) -> list[tuple[str, dict[str, Any]]]:
    """(what the case is about, its body): one per SDK parameter, role and content part. Each
    body's first user text is its marker, so the capture can tell them apart."""
    out = []
    for i, (key, extra) in enumerate(param_samples(endpoint)):
        out.append((key, _marked(base_body(endpoint), f"case p{i}") | extra))
    if endpoint in (CHAT, MESSAGES):
        for i, (item, message) in enumerate(message_samples(endpoint)):
            marker = f"case m{i}"
            user = {"role": "user", "content": marker}
            if message.get("role") == "user" and isinstance(message.get("content"), list):
                message = message | {"content": [{"type": "text", "text": marker}, *message["content"]]}
            elif message.get("role") == "user":
                message = user
            out.append((item, base_body(endpoint) | {"messages": conversation_with(message, user)}))
    return out


def _marked(body: dict[str, Any], marker: str) -> dict[str, Any]:
    if "prompt" in body:
        return body | {"prompt": marker}
    if "input" in body:
        return body | {"input": marker}
    if "contents" in body:
        return body | {"contents": [{"role": "user", "parts": [{"text": marker}]}]}
    return body | {"messages": [{"role": "user", "content": marker}]}


def spec_for(path: Path, route: str, endpoint: str, options: dict[str, Any]):
    return build_spec({
        "name": "conformance", "source": {"path": str(path), "id_column": "id"},
        "template": {"body_column": "body"}, "model": "m", "route": route, "route_options": options,
        "endpoint": endpoint, "retry": {"max_attempts": 1},
    })  # fmt: skip


def route_options(route: str, url: str) -> dict[str, Any]:
    if route in ("echo", "local"):
        return {}
    if route == "openai-compatible":
        return {"base_url": f"{url}/v1"}
    if route == "gemini":  # the model "m" is this test's own: listed, so it is not refused as unknown
        return {"base_url": url, "api_key_env": KEY_ENV, "models": ["m"]}
    if route == "vertex-batch":  # an access token from the environment; nothing reaches the bucket in the refusal half
        return {"base_url": url, "project": "proj", "location": "us-central1", "staging": "gs://conformance/lowtide",
                "access_token_env": KEY_ENV, "models": ["m"]}  # fmt: skip
    if route == "bedrock-batch":  # AWS's chain from the test's environment (the test sets it)
        return {"endpoint_url": url, "role_arn": "arn:aws:iam::123456789012:role/BedrockBatch", "staging": "s3://conformance/lowtide",
                "region": "us-east-1"}  # fmt: skip
    if route == "mistral-batch":
        return {"base_url": f"{url}/mistral", "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2]}
    if route == "digitalocean-batch":
        return {"base_url": f"{url}/digitalocean", "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2]}
    if route == "azure-batch":
        return {"endpoint": url, "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2]}
    if route in ("openai", "openai-batch"):
        return {"base_url": f"{url}/v1", "api_key_env": KEY_ENV, **({"poll_interval": [0.05, 0.2]} if route == "openai-batch" else {})}
    extra = {"poll_interval": [0.05, 0.2], "find_window": 10**7} if route == "anthropic-batch" else {}
    return {"base_url": url, "api_key_env": KEY_ENV, **extra}


def split(spec, path: Path) -> tuple[dict[str, str], list[int]]:
    """Ask the loader's own row check about every case: {row: refusal message}, accepted rows."""
    template = MessageTemplate.from_spec(spec)
    source = open_file(path, None)
    render = RowRenderer(spec, template, source)
    refused, accepted = {}, []
    for chunk in source.chunks():
        for row in chunk:
            item = render(row)
            assert not isinstance(item, str), item  # a case the loader cannot even read
            if isinstance(item, Refused):
                refused[row.number] = item.message
            else:
                accepted.append(row.number)
    return refused, accepted


ROUTES = ("openai", "openai-compatible", "anthropic", "gemini", "openai-batch", "azure-batch", "mistral-batch", "anthropic-batch", "echo", "local",
          "vertex-batch", "bedrock-batch", "digitalocean-batch")  # fmt: skip
# Routes checked for the refusal half only (the loader's row check names field and route), and
# why their accepted half is not run through serve here: serve's backends in front of the
# capture upstream speak OpenAI's chat or Anthropic's messages, so a Gemini body (vertex-batch,
# as gemini-batch, which is not in ROUTES for the same reason) reaches the capture translated,
# never as sent; a Bedrock record is an Anthropic body less its `model` plus `anthropic_version`,
# staged in S3 (tests/routes/test_bedrock_batch.py checks that record, and tests/routes/test_wire
# modules the mapping), so the capture's `got == sent` cannot hold for it either.
REFUSAL_ONLY = ("vertex-batch", "bedrock-batch")


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES, COMPLETIONS, MESSAGES, GEMINI])
@pytest.mark.parametrize("route", ROUTES)
def test_every_sdk_field_arrives_unchanged_or_is_refused_by_name(route, endpoint, tmp_path, monkeypatch, request):
    monkeypatch.setenv(KEY_ENV, "sk-conformance-key")
    if route == "bedrock-batch":  # AWS's chain from the environment only
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true"}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
    all_cases = cases(endpoint)
    with capture() as cap:
        if route in REFUSAL_ONLY:
            url = cap.url  # nothing is sent in the refusal half
        elif route.endswith("-batch"):
            server = request.getfixturevalue("serve_in_front")(cap.url, "anthropic" if route.startswith("anthropic") else "openai-compatible")
            url = server
        else:
            url = cap.url
        options = route_options(route, url)
        source = tmp_path / "cases.jsonl"
        source.write_text("".join(json.dumps({"id": f"c{i}", "body": body}) + "\n" for i, (_, body) in enumerate(all_cases)))
        spec = spec_for(source, route, endpoint, options)
        refused, accepted = split(spec, source)
        for number, message in refused.items():
            item = all_cases[number - 1][0]
            assert f"(route {route})" in message, message
            if message.startswith("endpoint:"):  # the route serves no request of this endpoint at all
                continue
            if item.startswith(("role ", "part ")):
                assert message.startswith(("messages", "system")), (item, message)
            else:
                assert message.startswith(item), (item, message)
        if not accepted or route == "local" or route in REFUSAL_ONLY:  # local: its model is not run here (tests/routes/test_local.py)
            return
        kept = tmp_path / "accepted.jsonl"
        kept.write_text("".join(json.dumps({"id": f"c{n - 1}", "body": all_cases[n - 1][1]}) + "\n" for n in accepted))
        spec = spec_for(kept, route, endpoint, options)
        store = Store(str(tmp_path / "client.db"))
        if route.endswith("-batch"):
            load_job(store, spec, ManualClock(0))
            _run(store, spec.name)
        else:
            drive_to_end(store, spec, ManualClock(1_000_000.0))
        with store.begin() as conn:
            states = dict(conn.execute(requests.select().with_only_columns(requests.c.custom_id, requests.c.state)).all())
        assert set(states.values()) == {"succeeded"}, states
        if route == "echo":
            return
        native = PROTOCOL[endpoint] == ROUTE_PROTOCOL.get(route, "openai")
        keys = {key for key, _ in param_samples(endpoint)}
        for n in accepted:
            item, sent = all_cases[n - 1]
            path, got = cap.seen[marker_of(sent)]
            if native and route == "gemini":
                # Gemini names the model in the URL, not the body; the SDK also writes an empty
                # `generationConfig` when the body has none (docs/gemini.md says so).
                assert path == f"/v1beta/models/{sent['model']}:generateContent" and "model" not in got, (path, got)
                want = {k: v for k, v in sent.items() if k != "model"}
                assert got == {"generationConfig": {}} | want, f"{item}: the upstream saw {got}, not {want}"
            elif native:
                assert got == sent, f"{item}: the upstream saw {got}, not {sent}"
            elif item.startswith(("role ", "part ")) or item not in keys:
                continue
            elif route == "gemini":
                assert item in GEMINI_LANDS, f"{item} is translated: add where it lands to GEMINI_LANDS"
                top, inner = GEMINI_LANDS[item]
                assert inner in got.get(top, {}), f"{item} should land in {top}.{inner}: {got}"
            else:
                assert item in LANDS, f"{item} is translated: add where it lands to LANDS"
                if LANDS[item] is not None:
                    assert LANDS[item] in got, f"{item} should land in {LANDS[item]}: {got}"
