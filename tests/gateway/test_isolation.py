"""Tenants stay apart at the upstream: the gateway forwards only an allow-list of endpoints,
and a file or batch a tenant makes through it is that tenant's alone — another tenant gets
the same 404 as for an id that does not exist, and lists only its own. The upstream is a real
`lowtide serve` (OpenAI files and batches, Anthropic message batches) that knows only the
gateway's key; the clients are the official SDKs."""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace
from urllib.parse import urlsplit

import anthropic
import openai
import pytest

from tests.server.conftest import chat_line, jsonl, message_request, running

from .conftest import KEYS, UPSTREAM_KEY, base_config, running_gateway, wait_until


@pytest.fixture
def behind_serve(tmp_path):
    """A gateway whose upstream (both APIs) is `lowtide serve`, which takes only the upstream key."""
    with running(tmp_path, db=str(tmp_path / "serve.db"), data_dir=tmp_path / "serve-data", api_keys=(UPSTREAM_KEY,)) as serve:
        config = base_config(tmp_path, SimpleNamespace(url=serve.url))
        with running_gateway(tmp_path, config) as g:
            yield g, serve


def _openai(g, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{g.url}/v1", api_key=KEYS[tenant], max_retries=0)


def _anthropic(g, tenant: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=g.url, api_key=KEYS[tenant], max_retries=0)


def test_a_tenants_files_and_batches_are_its_own(behind_serve):
    g, serve = behind_serve
    acme, globex = _openai(g, "acme"), _openai(g, "globex")
    file = acme.files.create(file=("in.jsonl", jsonl([chat_line("t-1", "one"), chat_line("t-2", "two")])), purpose="batch")
    batch = acme.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")

    for attempt in (
        lambda: globex.files.retrieve(file.id),
        lambda: globex.files.content(file.id),
        lambda: globex.files.delete(file.id),
        lambda: globex.batches.retrieve(batch.id),
        lambda: globex.batches.cancel(batch.id),
        lambda: globex.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert globex.files.list().data == [] and globex.batches.list().data == []
    with g.client("globex") as c:  # word for word the answer for an id that does not exist
        theirs, none = c.get(f"/v1/files/{file.id}"), c.get("/v1/files/file-doesnotexist")
    assert theirs.status_code == none.status_code == 404
    assert theirs.json()["error"]["message"].replace(file.id, "ID") == none.json()["error"]["message"].replace("file-doesnotexist", "ID")

    assert [f.id for f in acme.files.list().data] == [file.id]  # globex's delete did not happen
    assert [b.id for b in acme.batches.list().data] == [batch.id]
    done = wait_until(lambda: (b := acme.batches.retrieve(batch.id)).status == "completed" and b, what="the batch")
    lines = [json.loads(line) for line in acme.files.content(done.output_file_id).text.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ["t-1", "t-2"]
    with pytest.raises(openai.NotFoundError):  # the output file is the batch owner's too
        globex.files.content(done.output_file_id)
    assert acme.files.delete(file.id).deleted
    with pytest.raises(openai.NotFoundError):
        acme.files.retrieve(file.id)


def test_a_list_pages_through_only_the_tenants_own(behind_serve):
    g, _ = behind_serve
    acme, globex = _openai(g, "acme"), _openai(g, "globex")
    mine = [acme.files.create(file=(f"{i}.jsonl", jsonl([chat_line(f"a-{i}")])), purpose="batch").id for i in range(3)]
    theirs = globex.files.create(file=("g.jsonl", jsonl([chat_line("g")])), purpose="batch").id
    first = acme.files.list(limit=2)
    assert first.has_more and len(first.data) == 2
    assert sorted(f.id for f in acme.files.list(limit=2)) == sorted(mine)  # the SDK's auto-paging
    assert [f.id for f in globex.files.list()] == [theirs]


def test_a_tenants_message_batches_are_its_own(behind_serve):
    g, _ = behind_serve
    acme, globex = _anthropic(g, "acme"), _anthropic(g, "globex")
    batch = acme.messages.batches.create(requests=[message_request("m-1", "hello")])
    for attempt in (
        lambda: globex.messages.batches.retrieve(batch.id),
        lambda: list(globex.messages.batches.results(batch.id)),
        lambda: globex.messages.batches.cancel(batch.id),
        lambda: globex.messages.batches.delete(batch.id),
    ):
        with pytest.raises(anthropic.NotFoundError):
            attempt()
    assert list(globex.messages.batches.list()) == []
    with g.client("globex", headers={"x-api-key": KEYS["globex"], "anthropic-version": "2023-06-01"}) as c:
        theirs = c.get(f"/v1/messages/batches/{batch.id}")
    assert theirs.status_code == 404 and theirs.json() == {
        "type": "error", "error": {"type": "not_found_error", "message": f"message batch not found: {batch.id}"}}
    assert [b.id for b in acme.messages.batches.list()] == [batch.id]
    ended = wait_until(lambda: (b := acme.messages.batches.retrieve(batch.id)).processing_status == "ended" and b, what="the batch")
    assert ended.results_url == f"/v1/messages/batches/{batch.id}/results"  # the gateway's, not the upstream's
    assert [r.custom_id for r in acme.messages.batches.results(batch.id)] == ["m-1"]


def _raw(url: str, method: str, path: str, key: str = KEYS["acme"]) -> tuple[int, dict]:
    """One HTTP/1.1 request with the path exactly as given (clients would normalise it)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {key}\r\n"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())  # fmt: skip
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


ESCAPES = [
    "/v1/../metrics",
    "/v1/..%2F..%2Fdashboard/api/jobs",
    "/v1/messages/..%2F..%2F..%2Fmetrics",
    "/v1/%2e%2e/metrics",
    "/v1/%252e%252e/metrics",
    "/v1/models/..%2f..%2f..%2fmetrics",
    "/v1/files/%2E%2E%5Cmetrics",
    "/v1//metrics",
    "/v1/./models",
]


@pytest.mark.parametrize("path", ESCAPES)
def test_a_path_escaping_v1_is_refused_and_never_forwarded(gateway, upstream, path):
    with gateway() as g:
        status, body = _raw(g.url, "GET", path)
    assert status in (400, 404)
    error = body["error"]
    assert isinstance(error["message"], str) and error["type"] in ("invalid_request_error", "not_found_error")
    assert upstream.seen == []  # the upstream key went nowhere


@pytest.mark.parametrize("method, path", [("GET", "/v1/assistants"), ("POST", "/v1/responses"), ("GET", "/v1/chat/completions"),
                                          ("GET", "/v1/organization/users"), ("POST", "/v1/fine_tuning/jobs"),
                                          ("GET", "/v1/messages/batches/msgbatch_1/nope")])  # fmt: skip
def test_only_allow_listed_endpoints_are_forwarded(gateway, upstream, method, path):
    with gateway() as g, g.client() as c:
        refused = c.request(method, path)
        models = c.get("/v1/models")  # a shared endpoint still goes through, with the upstream's key
    assert refused.status_code == 404 and "Unknown path" in json.dumps(refused.json())
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "gpt-4o-mini"
    assert upstream.seen == ["GET /v1/models"]
    assert upstream.calls[-1]["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"


@pytest.fixture
def behind_serve_small_limits(tmp_path):
    """As behind_serve, with a 64 KiB limit on JSON bodies and 1 MiB on uploads."""
    with running(tmp_path, db=str(tmp_path / "serve.db"), data_dir=tmp_path / "serve-data", api_keys=(UPSTREAM_KEY,)) as serve:
        config = base_config(tmp_path, SimpleNamespace(url=serve.url), max_body_bytes=64 * 1024, max_upload_bytes=1024 * 1024)
        with running_gateway(tmp_path, config) as g:
            yield g, serve


def test_a_batch_file_is_passed_on_as_it_arrives_bounded_by_the_upload_limit(behind_serve_small_limits):
    """Uploads are not JSON bodies: they stream to the upstream (never held whole), bounded by
    max_upload_bytes, not by max_body_bytes."""
    g, _ = behind_serve_small_limits
    acme = _openai(g, "acme")
    lines = [chat_line(f"t-{i}", "x" * 400) for i in range(600)]  # ~300 KiB: over max_body_bytes
    data = jsonl(lines)
    assert 64 * 1024 < len(data) < 1024 * 1024
    file = acme.files.create(file=("in.jsonl", data), purpose="batch")
    assert acme.files.content(file.id).content == data  # arrived whole and unchanged
    with pytest.raises(openai.APIStatusError) as refused:
        acme.files.create(file=("big.jsonl", jsonl(lines * 4)), purpose="batch")  # ~1.2 MiB
    assert refused.value.status_code == 413
    assert refused.value.body["message"] == "The request body is too large: the limit is 1048576 bytes."
    assert [f.id for f in acme.files.list().data] == [file.id]  # nothing of the refused one was made


@pytest.mark.parametrize("path", ["/v1/files", "/v1/batches", "/v1/messages/batches"])
@pytest.mark.parametrize("limit", ["%C2%B2", "%D9%A1", "0", "ten"])
def test_a_list_limit_that_is_not_a_whole_number_is_a_400_in_the_apis_shape(gateway, upstream, path, limit):
    with gateway() as g, g.client(headers={"x-api-key": KEYS["acme"]}) as c:
        answer = c.get(f"{path}?limit={limit}")  # '²' and '١' pass str.isdigit; int refuses '²'
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert "limit" in error["message"] and (error.get("param") == "limit" or path.startswith("/v1/messages"))
    assert upstream.seen == []


def test_a_batch_naming_its_input_file_twice_is_refused_before_the_upstream(behind_serve):
    """JSON parsers differ on a repeated key (the first or the last wins): the gateway's
    reading of input_file_id must be the upstream's, so a repeat is refused, never forwarded."""
    g, serve = behind_serve
    acme, globex = _openai(g, "acme"), _openai(g, "globex")
    theirs = acme.files.create(file=("in.jsonl", jsonl([chat_line("a-1", "acme's secret")])), purpose="batch")
    mine = globex.files.create(file=("in.jsonl", jsonl([chat_line("g-1")])), purpose="batch")
    body = (f'{{"input_file_id": "{theirs.id}", "endpoint": "/v1/chat/completions", "completion_window": "24h", '
            f'"input_file_id": "{mine.id}"}}')  # fmt: skip
    with g.client("globex") as c:
        answer = c.post("/v1/batches", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "input_file_id"
    assert "more than once" in answer.json()["error"]["message"]
    assert globex.batches.list().data == []
    assert serve.openai(UPSTREAM_KEY).batches.list().data == []  # nothing reached the upstream
