"""Each official SDK, made as a user makes it (only the base URL and a key given; OpenAI's
and Anthropic's with strict response validation), runs its whole batch lifecycle against one
`lowtide serve`: upload, create, poll, read the results, list, cancel, delete. All three run
on the same server, so each one's strict lists also prove the APIs' files and batches apart:
OpenAI's file list never holds a Gemini file (its SDK knows no such purpose), an OpenAI
clean-up loop cannot delete the responses a Gemini batch points at, and Gemini's file list
holds Gemini's files only."""

from __future__ import annotations

import io
import json

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from tests.conftest import wait_until
from tests.server.conftest import chat_line, jsonl, message_request

GEMINI_ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED")


def let_through(gate, n: int = 1_000_000) -> None:
    """The gate answers `n` more requests from now on, and then holds the rest."""
    gate.allowed = gate.served + n


def openai_client(s) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="k", _strict_response_validation=True)


def anthropic_client(s) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.url, api_key="k", _strict_response_validation=True)


def gemini_client(s, api_version: str | None = None) -> genai.Client:
    return genai.Client(api_key="k", http_options=types.HttpOptions(base_url=s.url, api_version=api_version))


def openai_lifecycle(s, gate) -> str:
    """Returns the id of the output file the run left."""
    c = openai_client(s)
    let_through(gate, 2)  # the first batch's two requests; the second batch's are held
    file = c.files.create(file=("in.jsonl", jsonl([chat_line("a", "one"), chat_line("b", "two")])), purpose="batch")
    assert c.files.retrieve(file.id).purpose == "batch"
    batch = c.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_until(lambda: (b := c.batches.retrieve(batch.id)).status == "completed" and b, what="the OpenAI batch")
    out = {x["custom_id"]: x["response"]["body"]["choices"][0]["message"]["content"]
           for x in map(json.loads, c.files.content(done.output_file_id).text.splitlines())}  # fmt: skip
    assert out == {"a": "one", "b": "two"} and done.request_counts.completed == 2
    held = c.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_until(lambda: c.batches.retrieve(held.id).status == "in_progress", what="the second batch to start")
    assert c.batches.cancel(held.id).status == "cancelling"
    let_through(gate)
    assert wait_until(lambda: (b := c.batches.retrieve(held.id)).status == "cancelled" and b).cancelled_at is not None
    assert [b.id for b in c.batches.list()] == [held.id, batch.id]
    assert c.files.delete(file.id).deleted
    return done.output_file_id


def anthropic_lifecycle(s, gate) -> None:
    c = anthropic_client(s)
    let_through(gate, 2)
    batch = c.messages.batches.create(requests=[message_request("a", "one"), message_request("b", "two")])
    wait_until(lambda: c.messages.batches.retrieve(batch.id).processing_status == "ended", what="the message batch")
    answers = {r.custom_id: r.result.message.content[0].text for r in c.messages.batches.results(batch.id)}
    assert answers == {"a": "one", "b": "two"}
    held = c.messages.batches.create(requests=[message_request("c")])
    assert c.messages.batches.cancel(held.id).processing_status == "canceling"
    let_through(gate)
    wait_until(lambda: c.messages.batches.retrieve(held.id).processing_status == "ended", what="the cancelled batch")
    assert [b.id for b in c.messages.batches.list()] == [held.id, batch.id]
    assert c.messages.batches.delete(held.id).type == "message_batch_deleted"


def gemini_lifecycle(s, gate, api_version: str | None = None) -> str:
    """Returns the name of the responses file of the batch the run left."""
    c = gemini_client(s, api_version)
    let_through(gate, 2)
    lines = [{"key": k, "request": {"contents": [{"role": "user", "parts": [{"text": t}]}]}} for k, t in (("a", "one"), ("b", "two"))]
    uploaded = c.files.upload(file=io.BytesIO(jsonl(lines)), config={"mime_type": "jsonl", "display_name": "in.jsonl"})
    assert c.files.get(name=uploaded.name).size_bytes == len(jsonl(lines))
    made = c.batches.create(model="gemini-2.5-flash", src=uploaded.name)
    done = wait_until(lambda: (b := c.batches.get(name=made.name)).state.value in GEMINI_ENDED and b, what="the Gemini batch")
    assert done.state.value == "JOB_STATE_SUCCEEDED"
    got = {x["key"]: x["response"]["candidates"][0]["content"]["parts"][0]["text"]
           for x in map(json.loads, c.files.download(file=done.dest.file_name).decode().splitlines())}  # fmt: skip
    assert got == {"a": "one", "b": "two"}
    held = c.batches.create(model="gemini-2.5-flash", src=[{"contents": [{"role": "user", "parts": [{"text": "c"}]}]}])
    c.batches.cancel(name=held.name)
    let_through(gate)
    wait_until(lambda: c.batches.get(name=held.name).state.value == "JOB_STATE_CANCELLED", what="the cancelled batch")
    assert [b.name for b in c.batches.list()] == [held.name, made.name]
    c.batches.delete(name=held.name)
    c.files.delete(name=uploaded.name)
    return done.dest.file_name


@pytest.fixture
def shared(serve, gate):
    """One server whose echo answers only what the test lets through (conftest.GatedEcho)."""
    with serve(routes={"echo": gate}) as s:
        yield s


def test_each_sdk_runs_its_lifecycle_and_its_strict_lists_pass_after_the_others(shared, gate):
    gemini_output = gemini_lifecycle(shared, gate)
    anthropic_lifecycle(shared, gate)
    openai_output = openai_lifecycle(shared, gate)
    # OpenAI's strict list after Gemini's and Anthropic's batches: only OpenAI's files.
    listed = list(openai_client(shared).files.list())
    assert openai_output in [f.id for f in listed] and {f.purpose for f in listed} == {"batch_output"}
    # Gemini's list: its responses file, not OpenAI's output.
    g = gemini_client(shared)  # held: a client is closed once dropped, its pager with it
    assert [f.name for f in g.files.list()] == [gemini_output]
    assert len(list(anthropic_client(shared).messages.batches.list())) == 1


def test_an_openai_clean_up_loop_leaves_a_gemini_batchs_responses(shared, gate):
    responses = gemini_lifecycle(shared, gate, "v1beta")  # the version named, as older scripts do
    c = openai_client(shared)
    for f in c.files.list():
        c.files.delete(f.id)
    with pytest.raises(openai.NotFoundError):
        c.files.delete(responses.removeprefix("files/"))  # nor can it be reached by its id
    with pytest.raises(openai.NotFoundError):
        c.files.content(responses.removeprefix("files/"))
    g = gemini_client(shared, "v1beta")
    assert len(g.files.download(file=responses).decode().splitlines()) == 2
    openai_output = openai_lifecycle(shared, gate)
    with pytest.raises(genai.errors.ClientError) as err:
        g.files.get(name=f"files/{openai_output}")  # and Gemini's API cannot reach OpenAI's
    assert err.value.code == 404
