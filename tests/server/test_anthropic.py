"""Anthropic's Message Batches API, through the official SDK."""

from __future__ import annotations

import anthropic
import pytest

from tests.server.conftest import message_request, wait_anthropic


def test_a_batch_runs_to_ended_and_results_stream_in_anthropics_shapes(server):
    client = server.anthropic()
    requests = [
        message_request("plain", "hello there"),
        message_request("system", "blocks", system=[{"type": "text", "text": "be brief"}],
                        messages=[{"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]),
        message_request("short", "abcdefghijklmnop", max_tokens=2),
        message_request("other-model", "hi", model="claude-other"),
        {"custom_id": "no-max", "params": {"model": "claude-test", "messages": [{"role": "user", "content": "x"}]}},
        message_request("image", messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
    ]  # fmt: skip
    batch = client.messages.batches.create(requests=requests)
    assert batch.type == "message_batch" and batch.processing_status == "in_progress"
    assert batch.request_counts.processing == 6 and batch.results_url is None and batch.ended_at is None
    assert (batch.expires_at - batch.created_at).total_seconds() == 86400

    done = wait_anthropic(client, batch.id)
    assert done.request_counts.model_dump() == {"processing": 0, "succeeded": 4, "errored": 2, "canceled": 0, "expired": 0}
    assert done.ended_at >= done.created_at
    assert done.results_url == f"{server.url}/v1/messages/batches/{batch.id}/results"

    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert set(results) == {r["custom_id"] for r in requests}
    ok = results["plain"]
    assert ok.type == "succeeded"
    assert ok.message.content[0].text == "hello there" and ok.message.model == "claude-test"
    assert ok.message.role == "assistant" and ok.message.stop_reason == "end_turn"
    assert ok.message.usage.service_tier == "batch" and ok.message.usage.input_tokens > 0
    assert ok.message.usage.cache_read_input_tokens == 0 and ok.message.usage.cache_creation_input_tokens == 0
    assert results["system"].message.content[0].text == "one\ntwo"
    assert results["short"].message.stop_reason == "max_tokens"
    assert results["other-model"].message.model == "claude-other"
    errored = results["no-max"]
    assert errored.type == "errored"
    assert errored.error.type == "error" and errored.error.error.type == "invalid_request_error"
    assert "max_tokens" in errored.error.error.message
    assert results["image"].error.error.type == "invalid_request_error"


def test_raw_result_lines_have_the_exact_shape(server):
    client = server.anthropic()
    batch = client.messages.batches.create(requests=[message_request("a", "hi")])
    wait_anthropic(client, batch.id)
    raw = server.openai()._client  # any HTTP client will do: the results are plain JSONL
    lines = raw.get(f"{server.url}/v1/messages/batches/{batch.id}/results", headers={"x-api-key": "k"}).json()
    assert lines["custom_id"] == "a"
    message = lines["result"]["message"]
    assert set(message) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    assert message["usage"] == {"input_tokens": 1, "output_tokens": 1, "cache_creation_input_tokens": 0,
                                "cache_read_input_tokens": 0, "service_tier": "batch"}  # fmt: skip


def test_list_is_newest_first_with_after_and_before_cursors(server):
    client = server.anthropic()
    ids = [client.messages.batches.create(requests=[message_request("a")]).id for _ in range(5)]
    newest = ids[::-1]
    page = client.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == newest[:2]
    assert page.has_more is True and page.first_id == newest[0] and page.last_id == newest[1]
    assert [b.id for b in client.messages.batches.list(limit=2, after_id=newest[1]).data] == newest[2:4]
    assert [b.id for b in client.messages.batches.list(limit=2, before_id=newest[3]).data] == newest[1:3]
    assert [b.id for b in client.messages.batches.list(limit=2)] == newest  # the SDK follows after_id
    # backwards, page by page (the SDK follows before_id = first_id)
    assert [b.id for b in client.messages.batches.list(limit=2, before_id=newest[4])] == newest[2:4] + newest[0:2]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.list(limit=1001)


def test_cancel_then_delete(serve, gate):
    with serve(routes={"echo": gate}) as s:
        client = s.anthropic()
        batch = client.messages.batches.create(requests=[message_request(f"r{i}") for i in range(4)])
        with pytest.raises(anthropic.AnthropicError, match="results_url"):
            client.messages.batches.results(batch.id)
        with pytest.raises(anthropic.BadRequestError, match="still being processed"):
            client.messages.batches.delete(batch.id)
        canceling = client.messages.batches.cancel(batch.id)
        assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
        assert canceling.request_counts.processing == 4
        gate.release()
        done = wait_anthropic(client, batch.id)
        counts = done.request_counts
        assert counts.processing == 0 and counts.succeeded + counts.canceled == 4 and counts.canceled >= 3
        results = {r.custom_id: r.result.type for r in client.messages.batches.results(batch.id)}
        assert sorted(results) == ["r0", "r1", "r2", "r3"]
        assert sorted(results.values()).count("canceled") == counts.canceled
        with pytest.raises(anthropic.BadRequestError, match="already ended"):
            client.messages.batches.cancel(batch.id)
        deleted = client.messages.batches.delete(batch.id)
        assert (deleted.id, deleted.type) == (batch.id, "message_batch_deleted")
        with pytest.raises(anthropic.NotFoundError):
            client.messages.batches.retrieve(batch.id)


def test_bad_custom_ids_and_duplicates_are_refused_with_400(server):
    client = server.anthropic()
    for bad in ("has space", "x" * 65, ""):
        with pytest.raises(anthropic.BadRequestError, match="custom_id") as err:
            client.messages.batches.create(requests=[message_request(bad)])
        assert err.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError, match="more than once"):
        client.messages.batches.create(requests=[message_request("a"), message_request("a")])
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.create(requests=[])


def test_size_and_count_limits(serve):
    with serve(anthropic_max_requests=3, anthropic_max_bytes=2000) as s:
        client = s.anthropic()
        with pytest.raises(anthropic.BadRequestError, match="at most 3"):
            client.messages.batches.create(requests=[message_request(f"r{i}") for i in range(4)])
        with pytest.raises(anthropic.APIStatusError) as err:
            client.messages.batches.create(requests=[message_request("a", "x" * 3000)])
        assert err.value.status_code == 413
        assert err.value.body["error"]["type"] == "request_too_large"


def test_unknown_ids_are_404_in_anthropics_shape(server):
    client = server.anthropic()
    for call in (client.messages.batches.retrieve, client.messages.batches.cancel, client.messages.batches.delete):
        with pytest.raises(anthropic.NotFoundError) as err:
            call("msgbatch_nope")
        assert err.value.response.json() == {"type": "error", "error": {"type": "not_found_error", "message": "message batch not found: msgbatch_nope"}}
