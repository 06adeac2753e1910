"""Gemini's Files API, as the google-genai SDK calls it: the resumable upload
(`POST /upload/v1beta/files` with `X-Goog-Upload-Command: start`, then the chunks to the
`X-Goog-Upload-URL` it answers, each with its `X-Goog-Upload-Offset`, the last one
`upload, finalize`), `GET /v1beta/files` (the list, newest first, `pageSize` and
`pageToken`), `GET /v1beta/files/{name}`, `DELETE`, and the media download
(`GET /v1beta/files/{name}:download?alt=media`) of a batch's responses file. The same
calls on `/v1` arrive here too (gemini_versions.py); the URIs answered keep the version called.

An upload in progress is a part file and its header in `uploads/` of the data dir; a chunk
at the wrong offset is refused (400) and the client may start over. One never finished goes,
bytes and all, a week after its start on serve's clock (upload_sessions.py; swept at each
upload call). Files are rows of
`serve_files` (purpose `gemini_input` / `gemini_output`), named `files/<id>` to the client;
OpenAI's Files API never sees them, nor this one OpenAI's (records.GEMINI_PURPOSES).
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse
from sqlalchemy import Row
from starlette.concurrency import run_in_threadpool

from lowtide.server import records
from lowtide.server.bodies import parse_object, read_body, stream_body
from lowtide.server.context import Server
from lowtide.server.errors import ApiError
from lowtide.server.gemini_versions import version_of
from lowtide.server.upload_sessions import stamped, sweep

router = APIRouter()
FILE_DAYS = 2  # Gemini keeps an uploaded file 48 hours


def rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _server(request: Request) -> Server:
    return request.app.state.server


def file_object(row: Row, base: str) -> dict[str, Any]:
    """The File resource; `base` is the server's URL and the API version called."""
    generated = row.purpose == "gemini_output"
    out = {
        "name": f"files/{row.id}", "displayName": row.filename, "mimeType": "application/jsonl",
        "sizeBytes": str(row.bytes), "createTime": rfc3339(row.created_at), "updateTime": rfc3339(row.created_at),
        "expirationTime": rfc3339(row.expires_at), "uri": f"{base}/files/{row.id}", "state": "ACTIVE",
        "source": "GENERATED" if generated else "UPLOADED",
    }  # fmt: skip
    if generated:
        out["downloadUri"] = f"{base}/files/{row.id}:download?alt=media"
    return out


def get_file(server: Server, name: str) -> Row:
    with server.store.read() as conn:
        row = records.get_file(conn, name.removeprefix("files/"), "gemini")
    if row is None or (row.expires_at is not None and row.expires_at <= server.clock.now()):
        raise ApiError(404, f"File files/{name} does not exist or you do not have permission to access it.")
    return row


def _whole_number(text: str) -> bool:
    """Digits only, ASCII ones: `str.isdigit` also takes '²', which `int` refuses."""
    return text.isascii() and text.isdigit()


def _root(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _base(request: Request) -> str:
    """The server's URL with the API version the client called: `…/v1` or `…/v1beta`."""
    return f"{_root(request)}/{version_of(request)}"


@router.post("/upload/v1beta/files")
async def upload(request: Request, upload_id: str | None = None):
    server = _server(request)
    command = request.headers.get("x-goog-upload-command", "").replace(" ", "")
    staging = server.path("uploads")
    staging.mkdir(parents=True, exist_ok=True)
    await run_in_threadpool(sweep, staging, server.clock.now())
    if upload_id is None:
        return await _start(request, server, command, staging)
    if not upload_id.isalnum() or not (staging / f"{upload_id}.json").exists():
        raise ApiError(404, f"No upload session {upload_id}; start the upload again.")
    head = json.loads((staging / f"{upload_id}.json").read_text())
    part = staging / f"{upload_id}.part"
    have = part.stat().st_size
    offset = request.headers.get("x-goog-upload-offset", "")
    if not _whole_number(offset) or int(offset) != have:
        raise ApiError(400, f"X-Goog-Upload-Offset is {offset[:40]!r}; give the bytes uploaded so far: {have}.")
    limit = server.config.max_file_bytes
    # Bounded and timed as every other body (bodies.py); a chunk that does not arrive whole
    # is cut off again, so the client can send it once more at the same offset.
    with part.open("ab") as f:
        try:
            async for chunk in stream_body(request, limit - have, server.config.body_timeout, "The upload"):
                f.write(chunk)
        except BaseException as err:
            f.truncate(have)
            if isinstance(err, ApiError) and err.status == 413:
                raise ApiError(413, f"A file may be at most {limit:,} bytes.") from None
            raise
    if "finalize" not in command.split(","):
        return JSONResponse({}, headers={"X-Goog-Upload-Status": "active"})
    size = part.stat().st_size
    if head.get("size") is not None and size != head["size"]:
        raise ApiError(400, f"The upload has {size} bytes; its start said {head['size']}.")
    file_id = secrets.token_hex(8)
    files_dir = server.path("files")
    files_dir.mkdir(parents=True, exist_ok=True)
    part.rename(files_dir / f"gemini-{file_id}")
    (staging / f"{upload_id}.json").unlink()
    now = server.clock.now()
    with server.store.begin() as conn:
        records.insert_file(conn, id=file_id, purpose="gemini_input", filename=head.get("displayName") or file_id, bytes=size,
                            path=f"files/gemini-{file_id}", created_at=now, expires_at=now + FILE_DAYS * 86400)  # fmt: skip
        row = records.get_file(conn, file_id)
    return JSONResponse({"file": file_object(row, _base(request))}, headers={"X-Goog-Upload-Status": "final"})


async def _start(request: Request, server: Server, command: str, staging) -> JSONResponse:
    if request.headers.get("x-goog-upload-protocol") != "resumable" or command != "start":
        raise ApiError(400, "Start a resumable upload: X-Goog-Upload-Protocol: resumable, X-Goog-Upload-Command: start.")
    raw = await read_body(request, server.config.max_request_bytes, server.config.body_timeout)
    body = parse_object(raw, server.config.max_json_depth) if raw.strip() else {}
    given = body.get("file") if isinstance(body.get("file"), dict) else {}
    name = given.get("displayName")
    if name is not None and (not isinstance(name, str) or "\x00" in name):  # the store's text cannot hold a NUL
        raise ApiError(400, "file.displayName: give text without NUL characters.")
    size = request.headers.get("x-goog-upload-header-content-length")
    upload_id = secrets.token_hex(12)
    head = stamped({"displayName": given.get("displayName"), "size": int(size) if size and _whole_number(size) else None},
                   server.clock.now())  # fmt: skip
    (staging / f"{upload_id}.json").write_text(json.dumps(head))
    (staging / f"{upload_id}.part").write_bytes(b"")
    url = f"{_root(request)}/upload/{version_of(request)}/files?upload_id={upload_id}&upload_protocol=resumable"
    return JSONResponse({}, headers={"X-Goog-Upload-URL": url, "X-Goog-Upload-Status": "active"})


@router.get("/v1beta/files/{name}:download")
def download(name: str, request: Request, alt: str | None = None) -> FileResponse:
    server = _server(request)
    row = get_file(server, name)
    if alt != "media":
        raise ApiError(400, "Download the file's media with ?alt=media.")
    if row.purpose != "gemini_output":
        raise ApiError(400, "Only generated files can be downloaded; uploaded files cannot.")
    return FileResponse(server.path(row.path), media_type="application/octet-stream")


@router.get("/v1beta/files")
def list_(request: Request, pageSize: int = 10, pageToken: str | None = None) -> dict[str, Any]:  # noqa: N803 (Gemini's names)
    """Gemini's files, newest first; OpenAI's are not among them."""
    server = _server(request)
    if not 1 <= pageSize <= 100:
        raise ApiError(400, f"pageSize must be between 1 and 100; got {pageSize}.")
    with server.store.read() as conn:
        page = records.list_files(conn, pageSize, "desc", server.clock.now(), api="gemini", after=pageToken or None)
    if page is None:
        raise ApiError(400, f"pageToken {pageToken} is not valid.")
    rows, more = page
    out: dict[str, Any] = {"files": [file_object(r, _base(request)) for r in rows]}
    if more and rows:
        out["nextPageToken"] = rows[-1].id
    return out


@router.get("/v1beta/files/{name}")
def get(name: str, request: Request) -> dict[str, Any]:
    return file_object(get_file(_server(request), name), _base(request))


@router.delete("/v1beta/files/{name}")
def delete(name: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    row = get_file(server, name)
    with server.store.begin() as conn:
        records.delete_file(conn, row.id)
    server.path(row.path).unlink(missing_ok=True)
    return {}
