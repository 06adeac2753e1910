"""A NUL character where the store keeps text (a custom_id, a model, a file's display name):
PostgreSQL's text cannot hold one, so such a value is carried (custom_id, as `~` + base64)
or refused naming it — never a batch that cannot move on, nor a 500. On real PostgreSQL."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import _pg_available, fresh_pg_schema
from tests.server.conftest import (
    chat_line,
    create_batch,
    file_lines,
    message_request,
    running,
    wait_anthropic,
    wait_openai,
)

pytestmark = pytest.mark.skipif(not _pg_available(), reason="PostgreSQL is not reachable")


@pytest.fixture
def on_postgres(tmp_path):
    with fresh_pg_schema("lowtide_nul") as url, running(tmp_path, db=url) as s:
        yield s


def test_a_custom_id_with_nul_comes_back_and_a_model_with_nul_fails_its_batch(on_postgres):
    client = on_postgres.openai()
    done = wait_openai(client, create_batch(client, [chat_line("ok"), chat_line("a\x00b"), chat_line(" a\x00")]).id)
    assert done.status == "completed", done
    assert sorted(line["custom_id"] for line in file_lines(client, done.output_file_id)) == [" a\x00", "a\x00b", "ok"]
    refused = wait_openai(client, create_batch(client, [chat_line("x", model="m\x00")]).id)
    assert refused.status == "failed"
    (error,) = refused.errors.data
    assert error.code == "invalid_request" and error.param == "body.model" and error.line == 1
    after = wait_openai(client, create_batch(client, [chat_line("next")]).id)  # the queue moves on
    assert after.status == "completed"


def test_a_message_request_whose_model_has_nul_fails_alone(on_postgres):
    client = on_postgres.anthropic()
    bad = message_request("b", "hi")
    bad["params"]["model"] = "m\x00"
    batch = client.messages.batches.create(requests=[message_request("a", "hi"), bad])
    ended = wait_anthropic(client, batch.id)
    results = {r.custom_id: r.result for r in client.messages.batches.results(ended.id)}
    assert results["a"].type == "succeeded"
    assert results["b"].type == "errored" and "NUL" in results["b"].error.error.message


def test_gemini_names_with_nul_are_a_400(on_postgres):
    url, key = on_postgres.url, {"x-goog-api-key": "k"}
    start = httpx.post(f"{url}/upload/v1beta/files", json={"file": {"displayName": "in\x00.jsonl"}},
                       headers={**key, "X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start"})  # fmt: skip
    assert start.status_code == 400 and "displayName" in start.json()["error"]["message"]
    src = {"requests": {"requests": [{"request": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}}]}}
    made = httpx.post(f"{url}/v1beta/models/m%00:batchGenerateContent", json={"batch": {"inputConfig": src}}, headers=key)
    assert made.status_code == 400 and made.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert json.loads(made.text)["error"]["message"].startswith("model:")
