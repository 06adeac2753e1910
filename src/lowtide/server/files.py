"""OpenAI's Files API: uploads are streamed into `files/` in the data dir as they arrive
(written once, refused while reading when too large), contents streamed back."""

from __future__ import annotations

import contextlib
from pathlib import PurePosixPath
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse
from sqlalchemy import Row
from starlette.concurrency import run_in_threadpool

from lowtide.server import records
from lowtide.server.bodies import stream_body
from lowtide.server.context import Server
from lowtide.server.errors import ApiError, not_found
from lowtide.server.schemas import FILE_UPLOAD, form_body
from lowtide.server.uploads import FORM_OVERHEAD, FormReceiver

router = APIRouter(prefix="/v1/files")
# A batch's input file: OpenAI's purpose, and Together's word for it (its Batch API is OpenAI's otherwise)
BATCH_PURPOSES = ("batch", "batch-api")
PURPOSES = ("batch", "assistants", "fine-tune", "vision", "user_data", "evals", "batch-api")
FEED_BYTES = 256 * 1024  # also how far past its limit a file may get before the 413


def file_object(row: Row) -> dict[str, Any]:
    return {
        "id": row.id, "object": "file", "bytes": row.bytes, "created_at": int(row.created_at),
        "expires_at": int(row.expires_at) if row.expires_at is not None else None, "filename": row.filename,
        "purpose": row.purpose, "status": "processed", "status_details": None,
    }  # fmt: skip


def _server(request: Request) -> Server:
    return request.app.state.server


def _get(server: Server, file_id: str) -> Row:
    """The file, or OpenAI's 404: also once it has expired (its content is removed then),
    and for another API's file (records.GEMINI_PURPOSES)."""
    with server.store.read() as conn:
        row = records.get_file(conn, file_id, "openai")
    if row is not None and row.expires_at is not None and row.expires_at <= server.clock.now():
        expire(server, row)
        row = None
    if row is None or not server.path(row.path).exists():
        raise not_found("openai", "file", file_id)
    return row


def expire(server: Server, row: Row) -> None:
    """An expired file is gone, as at OpenAI: its row and its content."""
    with server.store.begin() as conn:
        records.delete_file(conn, row.id)
    with contextlib.suppress(OSError):
        server.path(row.path).unlink()


def batch_name_ok(filename: str) -> bool:
    """A batch input must be .jsonl; a name without an extension (the SDK names raw bytes
    `upload`, and many clients send such names) is taken as it is."""
    suffix = PurePosixPath(filename.replace("\\", "/")).suffix
    return suffix in ("", ".jsonl")


@router.post("", openapi_extra=form_body(FILE_UPLOAD))
async def upload(request: Request) -> dict[str, Any]:
    """The file is written once, straight into place, as it arrives (uploads.py)."""
    server = _server(request)
    config = server.config
    limit = config.max_file_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit + FORM_OVERHEAD:
        raise ApiError(413, f"File is too large: the limit is {limit:,} bytes.", param="file")
    file_id = records.new_id("file-")
    receiving = server.path(f"files/{file_id}.upload")
    form = FormReceiver(request.headers.get("content-type", ""), receiving, limit)
    try:
        pending = bytearray()
        async for chunk in stream_body(request, limit + FORM_OVERHEAD, config.body_timeout, "The upload"):
            pending += chunk
            if len(pending) >= FEED_BYTES:  # a thread hop per 256 KiB, not per network read
                await run_in_threadpool(form.write, bytes(pending))
                pending.clear()
        await run_in_threadpool(form.write, bytes(pending))
        form.finish()
        return await run_in_threadpool(_store, server, file_id, form)
    except BaseException:
        form.abort()
        raise


def _store(server: Server, file_id: str, form: FormReceiver) -> dict[str, Any]:
    purpose, filename = form.fields.get("purpose"), form.filename or "upload"
    if purpose not in PURPOSES:
        raise ApiError(400, f"'{purpose}' is not one of {list(PURPOSES)} - 'purpose'", param="purpose")
    if purpose in BATCH_PURPOSES and not batch_name_ok(filename):
        raise ApiError(400, "Invalid file format for Batch API. Must be .jsonl", param="file")
    now = server.clock.now()
    expires_at = _expires_after(form.fields, now)
    relative = f"files/{file_id}.jsonl" if purpose in BATCH_PURPOSES else f"files/{file_id}"
    form.target.rename(server.path(relative))
    values = {"id": file_id, "purpose": purpose, "filename": filename, "bytes": form.size, "path": relative,
              "created_at": now, "expires_at": expires_at}  # fmt: skip
    with server.store.begin() as conn:
        records.insert_file(conn, **values)
        return file_object(records.get_file(conn, file_id))


def _expires_after(form: dict[str, str], now: float) -> float | None:
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise ApiError(400, "expires_after[anchor] must be 'created_at'.", param="expires_after.anchor")
    try:
        value = int(str(seconds))
    except ValueError:
        value = -1
    if not 3600 <= value <= 2_592_000:
        raise ApiError(400, "expires_after[seconds] must be between 3600 and 2592000.", param="expires_after.seconds")
    return now + value


@router.get("")
def list_(request: Request, after: str | None = None, limit: int = 10_000, order: str = "desc",
          purpose: str | None = None) -> dict[str, Any]:  # fmt: skip
    """OpenAI's file list: newest first by default, `after` the last id of the page before.
    Gemini's files are not in it (gemini_files.py lists those)."""
    server = _server(request)
    if not 1 <= limit <= 10_000:
        raise ApiError(400, f"Invalid 'limit': integer below minimum value or above maximum value. Expected a value between 1 and 10000, but got {limit} instead.", param="limit")
    if order not in ("asc", "desc"):
        raise ApiError(400, f"Invalid 'order': expected one of 'asc' or 'desc', but got '{order}' instead.", param="order")
    with server.store.read() as conn:
        page = records.list_files(conn, limit, order, server.clock.now(), api="openai", after=after, purpose=purpose)
    if page is None:
        raise not_found("openai", "file", after or "")
    rows, more = page
    data = [file_object(r) for r in rows]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}  # fmt: skip


@router.get("/{file_id}")
def retrieve(file_id: str, request: Request) -> dict[str, Any]:
    return file_object(_get(_server(request), file_id))


@router.get("/{file_id}/content")
def content(file_id: str, request: Request) -> FileResponse:
    server = _server(request)
    row = _get(server, file_id)
    return FileResponse(server.path(row.path), media_type="application/octet-stream")


@router.delete("/{file_id}")
def delete(file_id: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    row = _get(server, file_id)
    with server.store.begin() as conn:
        records.delete_file(conn, file_id)
    with contextlib.suppress(OSError):
        server.path(row.path).unlink()
    return {"id": file_id, "object": "file", "deleted": True}
