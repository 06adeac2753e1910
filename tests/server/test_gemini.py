"""`lowtide serve` speaks Gemini: the official google-genai SDK, pointed at it, runs inline
and file batches (resumable upload, media download), lists, cancels and deletes them, and
calls generateContent in real time; a field the backend refuses fails that key alone. The
SDK runs at its default API version (`v1` in current releases) unless a test names one;
serve answers `v1` and `v1beta` alike."""

from __future__ import annotations

import asyncio
import io
import json

import httpx
import pytest
from google import genai
from google.genai import errors, types

from lowtide.core.types import Request
from lowtide.routes.gemini.direct import GeminiRoute
from tests.conftest import wait_until

MODEL = "gemini-2.5-flash"
ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED")


def client(s, api_version: str | None = None) -> genai.Client:
    """The SDK as a user makes it: only the base URL changed (and the version, if named)."""
    return genai.Client(api_key="k", http_options=types.HttpOptions(base_url=s.url, api_version=api_version))


def wait(c: genai.Client, name: str):
    wait_until(lambda: c.batches.get(name=name).state.value in ENDED, what="the batch to end")
    return c.batches.get(name=name)


def ask(text: str, **config) -> dict:
    body = {"contents": [{"role": "user", "parts": [{"text": text}]}]}
    return body | ({"generationConfig": config} if config else {})


def test_an_inline_batch_answers_each_request_under_its_key(server):
    c = client(server)
    src = [{"contents": [{"role": "user", "parts": [{"text": f"hello {i}"}]}], "metadata": {"key": f"k{i}"}} for i in range(4)]
    made = c.batches.create(model=MODEL, src=src, config={"display_name": "lowtide-key-1"})
    assert made.name.startswith("batches/") and made.display_name == "lowtide-key-1"
    assert made.state.value in ("JOB_STATE_PENDING", "JOB_STATE_RUNNING")
    done = wait(c, made.name)
    assert done.state.value == "JOB_STATE_SUCCEEDED"
    answers = {r.metadata["key"]: r.response.text for r in done.dest.inlined_responses}
    assert answers == {f"k{i}": f"hello {i}" for i in range(4)}
    usage = done.dest.inlined_responses[0].response.usage_metadata
    assert usage.prompt_token_count > 0 and usage.candidates_token_count > 0



def test_an_inline_batch_answers_in_request_order_each_with_its_own_metadata(server):
    # Gemini: "The responses will be in the same order as the input requests", each with the
    # request's metadata. serve wrote a refused request last and set metadata to {"key": ...}.
    c = client(server)
    src = [{"contents": ask("first")["contents"], "metadata": {"row": "7"}},
           {"contents": ask("second")["contents"], "config": {"top_k": 3}, "metadata": {"key": "b", "row": "8"}},
           {"contents": ask("third")["contents"]}]  # fmt: skip
    done = wait(c, c.batches.create(model=MODEL, src=src).name)
    got = done.dest.inlined_responses
    assert [r.metadata for r in got] == [{"row": "7"}, {"key": "b", "row": "8"}, None]
    assert [r.response and r.response.text for r in got] == ["first", None, "third"]
    assert got[1].error.code == 400 and "generationConfig.topK" in got[1].error.message


def test_a_request_without_metadata_and_one_keyed_by_its_index_are_two_requests(server):
    # A request without a key was taken under its index: metadata {"key": "0"} on another was
    # refused as "key '0' is used more than once", which Gemini does not do.
    c = client(server)
    src = [{"contents": ask("no key")["contents"]}, {"contents": ask("key 0")["contents"], "metadata": {"key": "0"}}]
    done = wait(c, c.batches.create(model=MODEL, src=src).name)
    assert done.state.value == "JOB_STATE_SUCCEEDED"
    assert [(r.metadata, r.response.text) for r in done.dest.inlined_responses] == [(None, "no key"), ({"key": "0"}, "key 0")]

@pytest.mark.parametrize("api_version", [None, "v1beta", "v1"])
def test_a_file_batch_uploads_resumably_and_its_responses_download_by_key(server, api_version):
    c = client(server, api_version)
    lines = [{"key": f"row-{i}", "request": ask(f"line {i}", maxOutputTokens=2)} for i in range(30)]
    data = "\n".join(json.dumps(line) for line in lines).encode()
    uploaded = c.files.upload(file=io.BytesIO(data), config={"mime_type": "jsonl", "display_name": "in.jsonl"})
    assert uploaded.name.startswith("files/") and uploaded.size_bytes == len(data)
    assert uploaded.uri.endswith(f"/{api_version or 'v1'}/{uploaded.name}")  # on the version called
    assert [f.name for f in c.files.list()] == [uploaded.name]
    done = wait(c, c.batches.create(model=MODEL, src=uploaded.name, config={"display_name": "k2"}).name)
    assert done.state.value == "JOB_STATE_SUCCEEDED" and done.dest.file_name
    got = [json.loads(x) for x in c.files.download(file=done.dest.file_name).decode().splitlines()]
    by_key = {g["key"]: g["response"] for g in got}
    assert set(by_key) == {f"row-{i}" for i in range(30)}
    cut = by_key["row-7"]["candidates"][0]
    assert cut["content"]["parts"][0]["text"] == "line 7"[:8] and cut["finishReason"] in ("STOP", "MAX_TOKENS")


def test_keys_seven_and_seven_point_zero_zero_are_two_requests(server):
    # "7.00" is the loader's key "7": carried as it was, the file was refused and every key failed.
    c = client(server)
    keys = ["7", "7.00", "other"]
    data = "\n".join(json.dumps({"key": k, "request": ask(f"about {k}")}) for k in keys).encode()
    uploaded = c.files.upload(file=io.BytesIO(data), config={"mime_type": "jsonl"})
    done = wait(c, c.batches.create(model=MODEL, src=uploaded.name).name)
    assert done.state.value == "JOB_STATE_SUCCEEDED"
    got = [json.loads(x) for x in c.files.download(file=done.dest.file_name).decode().splitlines()]
    assert {g["key"]: g["response"]["candidates"][0]["content"]["parts"][0]["text"] for g in got} == {k: f"about {k}" for k in keys}


def test_on_v1_a_call_is_geminis_by_its_header_or_by_a_path_only_gemini_has(server):
    c = client(server)
    made = c.batches.create(model=MODEL, src=[ask("x")])
    url = f"{server.url}/v1/{made.name}"
    as_gemini = httpx.get(url, headers={"x-goog-api-key": "k"})
    assert as_gemini.status_code == 200 and as_gemini.json()["name"] == made.name
    as_openai = httpx.get(url, headers={"Authorization": "Bearer k"})  # OpenAI's retrieve: no such batch
    assert as_openai.status_code == 404 and as_openai.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(url, params={"key": "k"}).json()["name"] == made.name
    cancel = httpx.post(f"{url}:cancel")  # no header: the path is Gemini's alone
    assert cancel.json() == {} or cancel.json()["error"]["status"] == "INVALID_ARGUMENT"  # (ended already)
    assert httpx.get(f"{server.url}/v1/files", headers={"x-goog-api-key": "k"}).json() == {"files": []}
    assert httpx.get(f"{server.url}/v1/files").json()["object"] == "list"  # OpenAI's


def test_with_keys_set_a_gemini_call_on_v1_needs_its_key_as_on_v1beta(serve):
    with serve(api_keys=("right",)) as s:
        for version in (None, "v1beta"):
            wrong = genai.Client(api_key="wrong", http_options=types.HttpOptions(base_url=s.url, api_version=version))
            with pytest.raises(errors.ClientError) as err:
                wrong.batches.list()
            assert err.value.code == 400 and err.value.status == "INVALID_ARGUMENT"  # Gemini's words, not OpenAI's
            c = genai.Client(api_key="right", http_options=types.HttpOptions(base_url=s.url, api_version=version))
            assert list(c.batches.list()) == []


def test_an_upload_chunk_at_the_wrong_offset_is_refused(server):
    start = httpx.post(f"{server.url}/upload/v1beta/files", json={"file": {"displayName": "x"}},
                       headers={"X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
                                "X-Goog-Upload-Header-Content-Length": "10"})  # fmt: skip
    url = start.headers["x-goog-upload-url"]
    first = httpx.post(url, content=b"12345", headers={"X-Goog-Upload-Command": "upload", "X-Goog-Upload-Offset": "0"})
    assert first.headers["x-goog-upload-status"] == "active"
    wrong = httpx.post(url, content=b"67890", headers={"X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": "3"})
    assert wrong.status_code == 400 and wrong.json()["error"]["status"] == "INVALID_ARGUMENT"
    last = httpx.post(url, content=b"67890", headers={"X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": "5"})
    assert last.headers["x-goog-upload-status"] == "final" and last.json()["file"]["sizeBytes"] == "10"


def test_a_field_the_backend_refuses_fails_that_key_alone(server):
    c = client(server)
    lines = [{"key": "fine", "request": ask("ok")}, {"key": "topk", "request": ask("no", topK=3)}]
    uploaded = c.files.upload(file=io.BytesIO("\n".join(map(json.dumps, lines)).encode()), config={"mime_type": "jsonl"})
    done = wait(c, c.batches.create(model=MODEL, src=uploaded.name).name)
    got = {g["key"]: g for g in map(json.loads, c.files.download(file=done.dest.file_name).decode().splitlines())}
    assert got["fine"]["response"]["candidates"][0]["content"]["parts"][0]["text"] == "ok"
    assert got["topk"]["error"]["code"] == 400 and "generationConfig.topK" in got["topk"]["error"]["message"]


def test_batches_are_listed_newest_first_cancelled_and_deleted(serve):
    with serve(complete_after=10**9) as s:  # the batches run until cancelled, however slow the machine
        c = client(s)
        names = [c.batches.create(model=MODEL, src=[ask(f"x{i}")], config={"display_name": f"d{i}"}).name for i in range(3)]
        listed = [b.display_name for b in c.batches.list(config={"page_size": 2})]
        assert listed == ["d2", "d1", "d0"]  # across two pages
        with pytest.raises(errors.ClientError):
            c.batches.delete(name=names[0])  # still running
        c.batches.cancel(name=names[0])
        assert wait(c, names[0]).state.value == "JOB_STATE_CANCELLED"
        c.batches.delete(name=names[0])
        with pytest.raises(errors.ClientError) as err:
            c.batches.get(name=names[0])
        assert err.value.code == 404


def test_the_fault_plan_fails_a_gemini_batch(serve, fault_plan):
    plan = fault_plan({"batches": [{"api": "gemini", "fail_validation": {"code": "invalid", "message": "quota gone"}}]})
    with serve(faults=plan) as s:
        c = client(s)
        done = wait(c, c.batches.create(model=MODEL, src=[ask("x")]).name)
        assert done.state.value == "JOB_STATE_FAILED"


def test_generate_content_in_real_time_through_the_sdk_and_the_gemini_route(server, monkeypatch):
    c = client(server)
    answer = c.models.generate_content(model=MODEL, contents="hello now", config={"max_output_tokens": 50})
    assert answer.text == "hello now" and answer.usage_metadata.prompt_token_count > 0
    monkeypatch.setenv("GEMINI_TEST_KEY", "k")

    async def through_route(**options):
        route = GeminiRoute({"base_url": server.url, "api_key_env": "GEMINI_TEST_KEY", **options})
        try:
            native = Request("a", "/v1beta/models:generateContent", {"model": MODEL, **ask("native body")})
            chat = Request.chat("b", MODEL, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "from chat"}], max_tokens=20)
            return {o.custom_id: o async for o in route.execute([native, chat])}
        finally:
            await route.aclose()

    # flex is sent as the body's serviceTier: echo, which has no tiers, refuses it by name
    flex = asyncio.run(through_route(service_tier="flex"))
    assert not flex["a"].ok and flex["a"].error_message.startswith("HTTP 400: serviceTier")
    outcomes = asyncio.run(through_route())
    assert outcomes["a"].ok and outcomes["a"].text == "native body"
    assert outcomes["b"].ok and outcomes["b"].text == "from chat"
    assert outcomes["a"].response["candidates"][0]["content"]["role"] == "model"  # the provider's own answer, kept


def test_a_field_mask_keeps_what_it_names_and_the_sdk_still_reads_the_whole_batch(server):
    c = client(server)
    made = c.batches.create(model=MODEL, src=[ask(f"m{i}") for i in range(3)], config={"display_name": "masked"})
    done = wait(c, made.name)
    assert len(done.dest.inlined_responses) == 3  # unmasked: the SDK's whole batch
    url = f"{server.url}/v1beta/{made.name}"
    part = httpx.get(url, params={"fields": "name,done,metadata(state,batchStats.requestCount)"}).json()
    assert part == {"name": made.name, "done": True, "metadata": {"state": "BATCH_STATE_SUCCEEDED", "batchStats": {"requestCount": "3"}}}
    dotted = httpx.get(url, params={"$fields": "metadata.output"}).json()
    assert len(dotted["metadata"]["output"]["inlinedResponses"]["inlinedResponses"]) == 3 and set(dotted) == {"metadata"}
    header = httpx.get(url, headers={"X-Goog-FieldMask": "metadata/displayName"}).json()
    assert header == {"metadata": {"displayName": "masked"}}
    assert httpx.get(url, params={"fields": "*"}).json() == httpx.get(url).json()
    listed = httpx.get(f"{server.url}/v1beta/batches", params={"fields": "operations(name,metadata.displayName)"}).json()
    assert listed == {"operations": [{"name": made.name, "metadata": {"displayName": "masked"}}]}
    newer = c.batches.create(model=MODEL, src=[ask("n")], config={"display_name": "newer"})
    page = httpx.get(f"{server.url}/v1beta/batches", params={"pageSize": 1, "fields": "operations(name),nextPageToken"}).json()
    assert page["operations"] == [{"name": newer.name}] and page["nextPageToken"]
    bad = httpx.get(url, params={"fields": "metadata(state"})
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT" and "metadata(state" in bad.json()["error"]["message"]
