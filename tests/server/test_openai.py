"""OpenAI's Files and Batches APIs, through the official SDK."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.conftest import chat_line, create_batch, file_lines, upload, wait_openai


def test_a_batch_runs_to_completed_with_output_and_error_files_in_openais_shapes(server):
    client = server.openai()
    items = [chat_line(f"req-{i}", f"hello {i}") for i in range(6)]
    items.append(chat_line("img", model="gpt-test") | {"body": {"model": "gpt-test", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]}})  # fmt: skip
    file = upload(client, items)
    assert (file.object, file.purpose, file.status, file.filename) == ("file", "batch", "processed", "in.jsonl")
    assert file.bytes == len(b"".join(json.dumps(i).encode() + b"\n" for i in items))
    assert client.files.retrieve(file.id).id == file.id

    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"team": "ml"}
    )
    assert batch.status == "validating"
    assert batch.expires_at == batch.created_at + 86400
    assert batch.metadata == {"team": "ml"}

    done = wait_openai(client, batch.id)
    assert done.status == "completed"
    assert done.model == "gpt-test"
    assert done.request_counts.model_dump() == {"total": 7, "completed": 6, "failed": 1}
    assert done.created_at <= done.in_progress_at <= done.finalizing_at <= done.completed_at
    assert done.failed_at is done.expired_at is done.cancelled_at is None
    assert done.usage.input_tokens > 0 and done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens

    output = file_lines(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"req-{i}" for i in range(6))
    line = next(x for x in output if x["custom_id"] == "req-3")
    assert set(line) == {"id", "custom_id", "response", "error"}
    assert line["id"].startswith("batch_req_") and line["error"] is None
    response = line["response"]
    assert response["status_code"] == 200 and response["request_id"].startswith("req_")
    body = response["body"]
    assert body["object"] == "chat.completion" and body["model"] == "gpt-test"
    assert body["choices"][0]["message"]["content"] == "hello 3"  # echo answers with the last user message
    assert body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    # The output body parses as the SDK's own ChatCompletion.
    assert openai.types.chat.ChatCompletion.model_validate(body).choices[0].message.content == "hello 3"

    errors = file_lines(client, done.error_file_id)
    assert [e["custom_id"] for e in errors] == ["img"]
    assert errors[0]["error"] is None
    assert errors[0]["response"]["status_code"] == 400
    assert set(errors[0]["response"]["body"]["error"]) == {"message", "type", "param", "code"}
    assert errors[0]["response"]["body"]["error"]["type"] == "invalid_request_error"

    out_file = client.files.retrieve(done.output_file_id)
    assert out_file.purpose == "batch_output" and out_file.filename == f"{batch.id}_output.jsonl"


def test_an_all_failed_batch_completes_without_an_output_file(server):
    client = server.openai()
    bad = {"model": "gpt-test", "messages": [{"role": "tool", "content": "x"}]}
    items = [chat_line(f"r{i}") | {"body": bad} for i in range(3)]
    done = wait_openai(client, create_batch(client, items).id)
    assert done.status == "completed"
    assert done.output_file_id is None and done.error_file_id is not None
    assert done.request_counts.model_dump() == {"total": 3, "completed": 0, "failed": 3}


def test_request_parameters_reach_the_backend(server):
    client = server.openai()
    items = [
        chat_line("short", "abcdefghijklmnop", max_tokens=2),
        chat_line("new", "abcdefghijklmnop", max_completion_tokens=1, temperature=0.2, stop=["x"]),
        chat_line("dev") | {"body": {"model": "gpt-test", "messages": [
            {"role": "developer", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "parts"}]}]}},
    ]  # fmt: skip
    done = wait_openai(client, create_batch(client, items).id)
    out = {line["custom_id"]: line["response"]["body"] for line in file_lines(client, done.output_file_id)}
    assert out["short"]["choices"][0]["message"]["content"] == "abcdefgh"  # echo cuts at max_tokens × 4
    assert out["short"]["choices"][0]["finish_reason"] == "length"
    assert out["new"]["choices"][0]["message"]["content"] == "abcd"
    assert out["dev"]["choices"][0]["message"]["content"] == "parts"


def test_custom_ids_of_any_form_come_back_unchanged(server):
    client = server.openai()
    ids = ["plain", " padded ", "~tilde", "with space/and#hash", "é-unicode", "x" * 100, ""]
    done = wait_openai(client, create_batch(client, [chat_line(i, f"c{n}") for n, i in enumerate(ids)]).id)
    assert done.status == "completed"
    out = file_lines(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(ids)
    for line in out:
        assert line["response"]["body"]["choices"][0]["message"]["content"] == f"c{ids.index(line['custom_id'])}"


def test_list_is_newest_first_with_cursor_pagination(server):
    client = server.openai()
    file = upload(client, [chat_line("a")])
    ids = [client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h").id for _ in range(5)]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2]
    assert page.has_more is True
    assert [b.id for b in client.batches.list(limit=2, after=ids[3]).data] == [ids[2], ids[1]]
    assert [b.id for b in client.batches.list(limit=2, after=ids[0]).data] == []
    assert [b.id for b in client.batches.list(limit=2)] == ids[::-1]  # the SDK follows `after`
    with pytest.raises(openai.BadRequestError):
        client.batches.list(limit=101)


def test_cancel_keeps_what_ran_and_cancels_the_rest(serve, gate):
    with serve(routes={"echo": gate}) as s:
        client = s.openai()
        batch = create_batch(client, [chat_line(f"r{i}") for i in range(5)])
        wait_openai(client, batch.id, ("in_progress",))
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
        assert client.batches.cancel(batch.id).status == "cancelling"  # asking twice is harmless
        gate.release(1)  # the request the backend was working on finishes
        done = wait_openai(client, batch.id)
        assert done.status == "cancelled" and done.cancelled_at >= done.cancelling_at
        assert done.request_counts.model_dump() == {"total": 5, "completed": 1, "failed": 4}
        assert [x["custom_id"] for x in file_lines(client, done.output_file_id)] == ["r0"]
        errors = file_lines(client, done.error_file_id)
        assert sorted(e["custom_id"] for e in errors) == ["r1", "r2", "r3", "r4"]
        assert all(e["response"] is None and e["error"]["code"] == "batch_cancelled" for e in errors)
        with pytest.raises(openai.BadRequestError, match="Cannot cancel"):
            client.batches.cancel(batch.id)


def test_unknown_ids_are_404_in_openais_shape(server):
    client = server.openai()
    with pytest.raises(openai.NotFoundError) as err:
        client.batches.retrieve("batch_nope")
    assert err.value.body == {"message": "No batch found with id 'batch_nope'.", "type": "invalid_request_error", "param": None, "code": None}
    assert err.value.response.json() == {"error": err.value.body}
    for call in (client.files.retrieve, client.files.content, client.files.delete, client.batches.cancel):
        with pytest.raises(openai.NotFoundError):
            call("file-nope")
    with pytest.raises(openai.NotFoundError, match="No file found with id 'file-nope'"):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")


def test_files_can_be_deleted_and_bad_uploads_are_refused(server):
    client = server.openai()
    file = upload(client, [chat_line("a")])
    assert client.files.delete(file.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file.id)
    with pytest.raises(openai.BadRequestError, match="Must be .jsonl"):
        client.files.create(file=("in.csv", b"a,b\n"), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("in.jsonl", b"{}\n"), purpose="nonsense")  # type: ignore[arg-type]
    expiring = client.files.create(file=("in.jsonl", b"{}\n"), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600})
    assert expiring.expires_at == expiring.created_at + 3600
    other = client.files.create(file=("notes.txt", b"hi"), purpose="user_data")
    with pytest.raises(openai.BadRequestError, match="purpose 'user_data'"):
        client.batches.create(input_file_id=other.id, endpoint="/v1/chat/completions", completion_window="24h")


def test_batch_parameters_are_checked_at_creation(server):
    client = server.openai()
    file = upload(client, [chat_line("a")])
    create = lambda **kw: client.batches.create(**({"input_file_id": file.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"} | kw))  # noqa: E731
    with pytest.raises(openai.BadRequestError, match="only '24h'"):
        create(completion_window="48h")
    with pytest.raises(openai.BadRequestError, match="not /v1/images/generations"):
        create(endpoint="/v1/images/generations")
    with pytest.raises(openai.BadRequestError, match="at most 16"):
        create(metadata={f"k{i}": "v" for i in range(17)})
    with pytest.raises(openai.BadRequestError, match="512"):
        create(metadata={"k": "v" * 513})


def test_file_content_streams_back_byte_for_byte(server):
    client = server.openai()
    data = b"".join(json.dumps(chat_line(f"r{i}", "x" * 1000)).encode() + b"\n" for i in range(3000))  # ~3.4 MB
    file = client.files.create(file=("big.jsonl", data), purpose="batch")
    assert file.bytes == len(data)
    assert client.files.content(file.id).read() == data
