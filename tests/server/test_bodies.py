"""Request bodies on every endpoint of serve: bounded while reading (413 before the rest
arrives), a read timeout (408 for a client that stops sending), JSON nested 100,000 deep
refused as 400 naming where, never a RecursionError; through raw sockets where the point
is what the server does before a body has ended."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import anthropic
import httpx
import openai
import pytest

from tests.server.conftest import chat_line, create_batch, message_request, wait_openai

KB = 1024
DEEP = 100_000
# (path, what the body is, the error shape): every endpoint of serve that reads a body.
ENDPOINTS = [
    ("/v1/chat/completions", "json", "openai"),
    ("/v1/batches", "json", "openai"),
    ("/v1/messages", "json", "anthropic"),
    ("/v1/messages/batches", "json", "anthropic"),
    ("/v1/files", "multipart", "openai"),
]
# With a key configured: the bodies stream through the key check's middleware too.
LIMITS = {"max_request_bytes": 64 * KB, "anthropic_max_bytes": 64 * KB, "max_file_bytes": 64 * KB, "api_keys": ("k",)}
BOUNDARY = "lowtideboundary"


def _head(port: int, path: str, kind: str, extra: str) -> bytes:
    ctype = f"multipart/form-data; boundary={BOUNDARY}" if kind == "multipart" else "application/json"
    return (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nauthorization: Bearer k\r\nx-api-key: k\r\n"
            f"content-type: {ctype}\r\n{extra}\r\n").encode()  # fmt: skip


def _opening(kind: str) -> bytes:
    """The start of a body whose end never comes: an open JSON string, or an open file part."""
    if kind == "multipart":
        return (f"--{BOUNDARY}\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{BOUNDARY}\r\n"
                f"content-disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n").encode()  # fmt: skip
    return b'{"model": "m", "messages": [{"role": "user", "content": "'


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], dict]:
    """The response the server sent (it must send one while the body is still open)."""
    sock.settimeout(15)
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        assert part, f"the server closed without answering: {data!r}"
        data += part
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        part = sock.recv(65536)
        if not part:
            break
        rest += part
    return int(lines[0].split()[1]), headers, json.loads(rest[:length])


def _shape_ok(api: str, body: dict, kind: str | None = None) -> str:
    if api == "anthropic":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        if kind:
            assert body["error"]["type"] == kind
        return body["error"]["message"]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]["message"]


@pytest.mark.parametrize(("path", "kind", "api"), ENDPOINTS)
def test_a_chunked_body_over_the_limit_is_refused_while_it_is_still_arriving(serve, path, kind, api):
    with serve(**LIMITS) as s, socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.sendall(_head(s.port, path, kind, "transfer-encoding: chunked\r\n") + _chunk(_opening(kind)))
        for _ in range(48):  # 384 KiB for a 64 KiB limit; the body is never ended
            sock.sendall(_chunk(b"x" * (8 * KB)))
        status, _, body = _answer(sock)
        leftovers = list((s.server.data_dir / "files").glob("*")) if kind == "multipart" else []
    assert status == 413
    message = _shape_ok(api, body, "request_too_large")
    assert str(64 * KB) in message.replace(",", "")
    assert leftovers == []  # the part of the upload written so far is removed


@pytest.mark.parametrize(("path", "kind", "api"), ENDPOINTS)
def test_a_declared_length_over_the_limit_is_refused_before_the_body(serve, path, kind, api):
    with serve(**LIMITS) as s, socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.sendall(_head(s.port, path, kind, f"content-length: {10 * 1024 * KB}\r\n"))
        status, _, body = _answer(sock)
    assert status == 413
    _shape_ok(api, body, "request_too_large")


@pytest.mark.parametrize(("path", "kind", "api"), ENDPOINTS)
def test_a_client_that_stops_sending_gets_408_and_the_connection_closes(serve, path, kind, api):
    with serve(body_timeout=0.3, api_keys=("k",)) as s, socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.sendall(_head(s.port, path, kind, "content-length: 5000\r\n") + _opening(kind))
        status, headers, body = _answer(sock)
        assert status == 408 and headers.get("connection") == "close"
        assert "not received in time" in _shape_ok(api, body)
        assert sock.recv(100) == b""  # closed: the stalled body no longer holds it


def test_the_sdks_read_the_413_of_a_body_they_send_whole(serve):
    with serve(**LIMITS) as s:
        with pytest.raises(openai.APIStatusError) as caught:
            s.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 100 * KB}])
        assert caught.value.status_code == 413
        with pytest.raises(anthropic.APIStatusError) as refused:
            s.anthropic().messages.batches.create(requests=[message_request(f"r{i}", "x" * 4 * KB) for i in range(40)])
        assert refused.value.status_code == 413 and refused.value.body["error"]["type"] == "request_too_large"


def _deep(n: int = DEEP) -> str:
    return "[" * n + "]" * n


DEEP_BODIES = [
    ("/v1/chat/completions", "openai", '{"model": "m", "messages": [{"role": "user", "content": %s}]}', "messages.0.content"),
    ("/v1/messages", "anthropic", '{"model": "m", "max_tokens": 5, "messages": %s}', "messages"),
    ("/v1/batches", "openai", '{"input_file_id": "f", "endpoint": "/v1/chat/completions", "completion_window": "24h", "metadata": %s}', "metadata"),
    ("/v1/messages/batches", "anthropic", '{"requests": [{"custom_id": "a", "params": {"model": "m"}}, {"custom_id": "b", "params": %s}]}', "requests.1"),
]


@pytest.mark.parametrize(("path", "api", "template", "where"), DEEP_BODIES)
def test_json_nested_100000_deep_is_a_400_naming_where(server, path, api, template, where):
    answer = httpx.post(f"{server.url}{path}", content=(template % _deep()).encode(), headers={"x-api-key": "k"}, timeout=30)
    assert answer.status_code == 400, answer.text
    message = _shape_ok(api, answer.json(), "invalid_request_error")
    assert "nested deeper than 64 levels" in message and where in message
    if api == "openai":
        assert answer.json()["error"]["param"].startswith(where)


def test_a_body_within_the_depth_limit_still_runs(serve, capture):
    schema = {"type": "object"}
    for _ in range(20):
        schema = {"type": "object", "properties": {"x": schema}}
    response_format = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    with serve(backend="openai-compatible", route_options={"base_url": capture.url, "concurrency": 1}) as s:
        answer = s.openai().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], response_format=response_format)
    assert answer.choices[0].message.content == "done" and answer.system_fingerprint == "fp_up"  # the upstream's own answer
    assert capture.bodies[0]["response_format"] == response_format


def test_a_lone_surrogate_in_a_body_is_a_400_naming_the_field(server):
    body = b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    answer = httpx.post(f"{server.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages.0.content"
    requests = b'{"requests": [{"custom_id": "a", "params": {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "\\udfff"}]}}]}'
    answer = httpx.post(f"{server.url}/v1/messages/batches", content=requests, headers={"x-api-key": "k"})
    assert answer.status_code == 400 and "requests.0" in answer.json()["error"]["message"], answer.text


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_number_json_cannot_hold_is_a_400_naming_the_field(server, number):
    """The standard library reads NaN and Infinity (and 1e400 as inf); they are not JSON, and
    read on they were written as null: a body changed, not refused."""
    body = f'{{"model": "m", "temperature": {number}, "messages": [{{"role": "user", "content": "hi"}}]}}'.encode()
    answer = httpx.post(f"{server.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "temperature", answer.text
    assert "not valid JSON" in answer.json()["error"]["message"]
    requests = (f'{{"requests": [{{"custom_id": "a", "params": {{"model": "m", "max_tokens": 5, "temperature": {number}, '
                f'"messages": [{{"role": "user", "content": "hi"}}]}}}}]}}').encode()  # fmt: skip
    answer = httpx.post(f"{server.url}/v1/messages/batches", content=requests, headers={"x-api-key": "k"})
    assert answer.status_code == 400 and "requests.0" in answer.json()["error"]["message"], answer.text
    fine = body.replace(number.encode(), b"1e-300")  # a 3-digit exponent that is finite still runs
    assert httpx.post(f"{server.url}/v1/chat/completions", content=fine, headers={"content-type": "application/json"}).status_code == 200


def test_a_batch_line_with_nan_fails_the_batch_naming_the_line_and_field(serve):
    line = json.dumps(chat_line("nan")).replace('"model"', '"temperature": NaN, "model"')
    with serve() as s:
        client = s.openai()
        ended = wait_openai(client, create_batch(client, [chat_line("ok"), line]).id)
    assert ended.status == "failed"
    (error,) = ended.errors.data
    assert error.line == 2 and error.code == "invalid_json_line" and error.param == "body.temperature"


def test_malformed_json_on_batches_says_what_and_names_no_position_as_a_param(server):
    answer = httpx.post(f"{server.url}/v1/batches", content=b'{"input_file_id": "f", "endpoint" "/v1/chat/completions"}',
                        headers={"content-type": "application/json"})  # fmt: skip
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] is None
    assert "not valid JSON" in error["message"] and "line 1 column" in error["message"]


def test_a_batches_field_at_fault_is_named(server):
    with pytest.raises(openai.BadRequestError) as caught:
        server.openai().batches.create(input_file_id="f", endpoint="/v1/chat/completions", completion_window="24h",
                                       metadata={"k": 5})  # type: ignore[dict-item]  # fmt: skip
    assert caught.value.body["param"] == "metadata.k"


# Batch input lines ------------------------------------------------------------------------
def test_a_batch_line_nested_100000_deep_fails_the_batch_naming_the_line(serve):
    deep = json.dumps(chat_line("deep"))[:-2] + ', "extra": ' + _deep() + "}}"
    with serve() as s:
        client = s.openai()
        batch = create_batch(client, [chat_line("ok"), deep])
        ended = wait_openai(client, batch.id)
    assert ended.status == "failed"
    (error,) = ended.errors.data
    assert error.line == 2 and error.code == "invalid_json_line" and "nested deeper than 64 levels" in error.message
    assert error.param.startswith("body.extra")
    with serve() as again:  # and it stays so: a restart finds it ended
        assert again.openai().batches.retrieve(batch.id).status == "failed"


def test_a_lone_surrogate_custom_id_fails_the_batch_at_validation_naming_the_line(serve, tmp_path):
    line = '{"custom_id": "\\ud800x", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}'
    with serve() as s:
        client = s.openai()
        batch = create_batch(client, [chat_line("ok"), line])
        ended = wait_openai(client, batch.id)
    assert ended.status == "failed"
    (error,) = ended.errors.data
    assert error.line == 2 and error.param == "custom_id" and "surrogate" in error.message
    with serve() as again:  # and it stays so: a restart finds it ended
        assert again.openai().batches.retrieve(batch.id).status == "failed"


def test_a_lone_surrogate_custom_id_in_an_output_line_is_written_as_its_escape():
    """For a batch taken in before the intake refused such ids (it stayed in finalizing)."""
    from lowtide.server.finalize import LONE_SURROGATES  # noqa: PLC0415  (absent before the fix)
    from lowtide.server.outputs import Result, openai_line  # noqa: PLC0415

    line, _ = openai_line("batch_x", Result("\ud800x", "cancelled", "m"), 0)
    data = (line + "\n").encode("utf-8", LONE_SURROGATES)
    assert json.loads(data)["custom_id"] == "\ud800x"


# The dashboard ------------------------------------------------------------------------------
@pytest.mark.parametrize(("refresh", "status"), [("nan", 400), ("inf", 400), ("-inf", 400), ("-5", 200), ("1e308", 200)])
def test_the_dashboard_refresh_must_be_a_finite_number(server, refresh, status):
    answer = httpx.get(f"{server.url}/dashboard", params={"refresh": refresh})
    assert answer.status_code == status
    if status == 200:  # clamped to 0.2 to 60 seconds
        assert f'data-refresh="{200 if refresh == "-5" else 60000}"' in answer.text


def _gemini_upload(s, **headers: str | bytes) -> str:
    """A resumable Gemini upload started; its upload URL."""
    start = httpx.post(f"{s.url}/upload/v1beta/files", json={"file": {"displayName": "in.jsonl"}},
                       headers={"x-goog-api-key": "k", "X-Goog-Upload-Protocol": "resumable",
                                "X-Goog-Upload-Command": "start", **headers})  # fmt: skip
    assert start.status_code == 200, start.text
    return start.headers["x-goog-upload-url"]


def _chunk_to(url: str, data: bytes, offset: str, command: str = "upload") -> httpx.Response:
    return httpx.post(url, content=data, headers={"x-goog-api-key": "k", "X-Goog-Upload-Command": command,
                                                  "X-Goog-Upload-Offset": offset})  # fmt: skip


@pytest.mark.parametrize("offset", ["abc", "-1", "\u00b2", ""])
def test_a_gemini_upload_offset_that_is_not_a_number_is_a_400(serve, offset):
    with serve(api_keys=("k",)) as s:
        url = _gemini_upload(s, **{"X-Goog-Upload-Header-Content-Length": "\u00b2".encode("latin-1")})
        answer = _chunk_to(url, b"12345", offset.encode("latin-1"))  # type: ignore[arg-type]
        assert answer.status_code == 400 and answer.json()["error"]["status"] == "INVALID_ARGUMENT"
        assert "X-Goog-Upload-Offset" in answer.json()["error"]["message"]
        assert _chunk_to(url, b"12345", "0", "upload, finalize").json()["file"]["sizeBytes"] == "5"


def test_a_gemini_upload_chunk_over_the_file_limit_is_refused_and_not_kept(serve):
    with serve(max_file_bytes=4 * KB, api_keys=("k",)) as s:
        url = _gemini_upload(s)
        assert _chunk_to(url, b"x" * (3 * KB), "0").status_code == 200
        over = _chunk_to(url, b"y" * (64 * KB), str(3 * KB))
        assert over.status_code == 413 and over.json()["error"]["message"] == "A file may be at most 4,096 bytes."
        parts = [p.stat().st_size for p in (s.server.data_dir / "uploads").glob("*.part")]
        assert parts == [3 * KB]  # what came of the refused chunk is not kept
        done = _chunk_to(url, b"z" * KB, str(3 * KB), "upload, finalize")
        assert done.json()["file"]["sizeBytes"] == str(4 * KB)


def test_a_gemini_upload_chunk_that_stops_arriving_gets_408_and_can_be_sent_again(serve):
    with serve(body_timeout=0.3, api_keys=("k",)) as s, socket.create_connection(("127.0.0.1", s.port)) as sock:
        url = urlsplit(_gemini_upload(s))
        sock.sendall(f"POST {url.path}?{url.query} HTTP/1.1\r\nhost: 127.0.0.1:{s.port}\r\nx-goog-api-key: k\r\n"
                     "x-goog-upload-command: upload\r\nx-goog-upload-offset: 0\r\ncontent-length: 5000\r\n\r\n".encode()
                     + b"x" * 1000)  # fmt: skip
        status, headers, body = _answer(sock)
        assert status == 408 and headers.get("connection") == "close"
        assert "not received in time" in body["error"]["message"] and body["error"]["code"] == 408
        assert sock.recv(100) == b""
        again = _chunk_to(url.geturl(), b"x" * 5000, "0", "upload, finalize")  # the partial chunk was cut off
        assert again.json()["file"]["sizeBytes"] == "5000"


# Issue 34: N4, N5, N6 ----------------------------------------------------------------------
def _form(boundary: str, content: bytes, close: bool = True) -> bytes:
    body = (f"--{boundary}\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n"
            f"content-disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n").encode() + content  # fmt: skip
    return body + (f"\r\n--{boundary}--\r\n".encode() if close else b"")


def _post_form(s, boundary: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{s.url}/v1/files", content=body, headers={"content-type": f"multipart/form-data; boundary={boundary}"})


@pytest.mark.parametrize("cut", ["line", "part"])
def test_an_upload_without_its_closing_boundary_is_refused_and_not_stored(server, cut):
    """N4: cut at a line end, the file was stored truncated and `processed`; the batch ran
    fewer requests. An earlier version refused it with 400; so does this one."""
    lines = b"".join((json.dumps(chat_line(f"r{i}")) + "\n").encode() for i in range(3))
    body = _form(BOUNDARY, lines, close=False) if cut == "line" else _form(BOUNDARY, lines)[:-len(f"--{BOUNDARY}--\r\n")]
    answer = _post_form(server, BOUNDARY, body)
    assert answer.status_code == 400, answer.text
    assert f"ended before its closing boundary ('--{BOUNDARY}--')" in answer.json()["error"]["message"]
    assert answer.json()["error"]["param"] == "file"
    assert list((server.server.data_dir / "files").glob("*")) == []
    assert server.openai().files.list().data == []
    whole = _post_form(server, BOUNDARY, _form(BOUNDARY, lines))  # the same form, whole, is taken
    assert whole.status_code == 200 and whole.json()["bytes"] == len(lines)


@pytest.mark.parametrize(("length", "status"), [(257, 400), (10_000, 400), (71, 400), (70, 200), (1, 200)])
def test_a_multipart_boundary_longer_than_rfc_2046_allows_is_a_400_naming_the_limit(server, length, status):
    """N5: a boundary over 256 characters was a 500 and a traceback (the parser's own limit)."""
    boundary = ("b" * length)[:length]
    answer = _post_form(server, boundary, _form(boundary, b'{"x": 1}\n'))
    assert answer.status_code == status, answer.text
    if status == 400:
        message = answer.json()["error"]["message"]
        assert f"boundary is {length:,} characters; RFC 2046 allows 1 to 70" in message


def _message_batch_socket(s, chunks) -> tuple[int, dict]:
    """A chunked `POST /v1/messages/batches` whose body is `chunks` and never ends: the
    answer must come while the bytes are still arriving."""
    with socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.sendall(_head(s.port, "/v1/messages/batches", "json", "transfer-encoding: chunked\r\n"))
        try:
            for chunk in filter(None, chunks):  # an empty chunk would end the body
                sock.sendall(_chunk(chunk))
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed while we were still sending: the answer is read below
        status, _, body = _answer(sock)
    return status, body


@pytest.mark.parametrize(("start", "filler", "said"), [
    (b"", b"\x00", "unexpected byte 0x00 at byte 0"),
    (b'{"requests": [{"custom_id": "a", "params":', b"\x00", "unexpected byte 0x00 at byte 42"),
    (b'{"requests": [{"custom_id": "', b"\x00", "a raw control character (byte 0x00)"),
    (b"", b" ", "more than 65,536 bytes of whitespace in a row at byte 0"),
    (b'{"requests": [{"custom_id": "a", "params":', b"\n", "more than 65,536 bytes of whitespace in a row at byte 42"),
])  # fmt: skip
def test_a_message_batch_of_bytes_that_are_not_json_is_refused_as_they_arrive(server, start, filler, said):
    """N6: 400 MB of NULs were held (RSS +260 MB, 26 s) until the 256 MiB limit; a valid batch
    behind 100 MB of spaces was taken. Now the chunk that brings them is refused."""
    status, body = _message_batch_socket(server, [start, *[filler * (64 * KB)] * 64])  # 4 MiB, never ended
    assert status == 400, body
    assert said in _shape_ok("anthropic", body, "invalid_request_error")


def test_a_valid_message_batch_with_some_whitespace_is_still_taken(server):
    request = json.dumps(message_request("a", "hi"), indent=4).encode()
    body = b'{\n  "requests": [\n' + b" " * 60_000 + request + b"\r\n\t]\n}\n"
    answer = httpx.post(f"{server.url}/v1/messages/batches", content=body, headers={"x-api-key": "k"})
    assert answer.status_code == 200 and answer.json()["request_counts"]["processing"] == 1, answer.text
