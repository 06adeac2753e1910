"""DigitalOcean's batch inference API, under `/digitalocean`: the `pydo` SDK pointed at
`inference_endpoint="http://HOST:PORT/digitalocean"` makes a file intent, uploads to its
presigned URL, creates, polls, lists, cancels and reads results' download links as it does
at https://inference.do-ai.run (`/v1/batches/files`, `/v1/batches`, `/v1/batches/{id}`,
`.../cancel`, `.../results`), the key as `Authorization: Bearer` (checked here: the paths
are not under `/v1/`, where app.py checks keys).

Presigned URLs (`/digitalocean/presigned/{file_id}`) carry an HMAC of the file id and their
expiry under a secret of this process, and no key, as DigitalOcean's Spaces URLs do: a PUT
there stores the bytes as a `batch` file, a GET reads an output or error file.

A batch runs as one of serve's OpenAI batches (the same worker, backend, fault plan and
output files) over the uploaded file; the DigitalOcean fields (`request_id`, `provider`)
ride in its metadata under MARK. A create repeating a `request_id` answers the batch made
with it and makes nothing (DigitalOcean's idempotency). Only provider `openai` is run here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Row
from starlette.concurrency import run_in_threadpool

from lowtide.core.endpoints import CHAT, RESPONSES
from lowtide.server import records
from lowtide.server.bodies import parse_object, read_body
from lowtide.server.context import Server
from lowtide.server.errors import ApiError
from lowtide.server.openai_api import batch_object
from lowtide.server.records import TERMINAL
from lowtide.server.records import BatchStatus as S
from lowtide.server.schemas import validated

PREFIX = "/digitalocean"
MARK = "lowtide_serve_digitalocean"  # the metadata key a DigitalOcean batch's own fields ride under
ENDPOINTS = (CHAT, RESPONSES)  # DigitalOcean's `endpoint` values for provider openai
URL_SECONDS = 900  # a presigned URL's life (DigitalOcean: about 15 minutes)
_SECRET = secrets.token_bytes(32)  # signs this process's presigned URLs
_creating = threading.Lock()  # a request_id is looked up and its batch inserted together

router = APIRouter(prefix=PREFIX)


def _server(request: Request) -> Server:
    return request.app.state.server


def _keyed(request: Request) -> None:
    """The key check app.py does for /v1/ paths, for these."""
    keys = _server(request).config.api_keys
    bearer = request.headers.get("authorization", "")
    given = bearer[7:].strip() if bearer.lower().startswith("bearer ") else ""
    if keys and not any(hmac.compare_digest(given.encode(), k.encode()) for k in keys):
        raise ApiError(401, "Unable to authenticate you: send a model access key as Authorization: Bearer KEY.")


def _iso(stamp: float | None) -> str | None:
    return None if stamp is None else datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _signature(file_id: str, expires: int) -> str:
    return hmac.new(_SECRET, f"{file_id}:{expires}".encode(), hashlib.sha256).hexdigest()


def _presigned(request: Request, file_id: str) -> tuple[str, int]:
    expires = int(time.time()) + URL_SECONDS  # real time: a URL's life is the client's wall clock
    base = str(request.base_url).rstrip("/")
    return f"{base}{PREFIX}/presigned/{file_id}?expires={expires}&signature={_signature(file_id, expires)}", expires


def _check_signature(file_id: str, expires: int, signature: str) -> None:
    try:  # a forged URL may hold any text: not a signature, never a 500
        signed = hmac.compare_digest(signature.encode(), _signature(file_id, expires).encode())
    except (UnicodeError, TypeError, ValueError):
        signed = False
    if not signed or expires < time.time():
        raise ApiError(403, "The presigned URL's signature does not match or it has expired: ask for a new one.")


# Files ------------------------------------------------------------------------------------
@router.post("/v1/batches/files", status_code=201, dependencies=[Depends(_keyed)])
async def file_intent(request: Request) -> dict[str, Any]:
    server = _server(request)
    body = parse_object(await read_body(request, server.config.max_request_bytes, server.config.body_timeout), server.config.max_json_depth)
    name = body.get("file_name")
    if not isinstance(name, str) or not name.lower().endswith(".jsonl"):
        raise ApiError(400, "file_name is required and must end with .jsonl.", param="file_name")
    file_id = str(uuid.uuid4())
    url, expires = _presigned(request, file_id)
    return {"file_id": file_id, "upload_url": url, "expires_at": _iso(expires)}


@router.put("/presigned/{file_id}")
async def upload(file_id: str, request: Request, expires: int, signature: str) -> dict[str, Any]:
    """The bytes of a file intent, stored as a `batch` file under the intent's id."""
    _check_signature(file_id, expires, signature)
    server = _server(request)
    data = await read_body(request, server.config.max_file_bytes, server.config.body_timeout)
    return await run_in_threadpool(_store_upload, server, file_id, data)


def _store_upload(server: Server, file_id: str, data: bytes) -> dict[str, Any]:
    relative = f"files/{file_id}.digitalocean.jsonl"
    server.path("files").mkdir(parents=True, exist_ok=True)
    server.path(relative).write_bytes(data)
    with server.store.begin() as conn:
        if records.get_file(conn, file_id) is None:
            records.insert_file(conn, id=file_id, purpose="batch", filename=f"{file_id}.jsonl", bytes=len(data),
                                path=relative, created_at=server.clock.now(), expires_at=None)  # fmt: skip
    return {}


@router.get("/presigned/{file_id}")
def download(file_id: str, request: Request, expires: int, signature: str) -> FileResponse:
    _check_signature(file_id, expires, signature)
    server = _server(request)
    with server.store.read() as conn:
        row = records.get_file(conn, file_id)
    if row is None:
        raise ApiError(404, "NoSuchKey: the object is gone.")
    return FileResponse(server.path(row.path), media_type="application/octet-stream")


# Batches ----------------------------------------------------------------------------------
class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    file_id: str
    provider: str
    completion_window: str = "24h"
    request_id: str
    endpoint: str | None = None
    metadata: dict[str, str] | None = None


def batch_json(server: Server, row: Row) -> dict[str, Any]:
    """A serve batch as DigitalOcean's batch object (ISO 8601 times, `batch_id`)."""
    batch = batch_object(server, row)
    own = json.loads(batch["metadata"].pop(MARK))
    errors = json.loads(row.errors)["data"] if row.errors else []
    return {
        "batch_id": row.id, "provider": own["provider"], "request_id": own["request_id"], "input_file_id": row.input_file_id,
        "endpoint": row.endpoint, "completion_window": row.completion_window, "status": row.status,
        "created_at": _iso(row.created_at), "expires_at": _iso(row.expires_at),
        **{f"{s}_at": _iso(getattr(row, f"{s}_at")) for s in ("in_progress", "finalizing", "completed", "failed", "cancelled")},
        "output_file_id": row.output_file_id, "error_file_id": row.error_file_id, "request_counts": batch["request_counts"],
        "errors": [{"code": e.get("code"), "line": e.get("line"), "message": e["message"]} for e in errors],
        "metadata": batch["metadata"] or None,
    }  # fmt: skip


def _own(row: Row) -> dict[str, Any] | None:
    meta = json.loads(row.metadata or "{}")
    return json.loads(meta[MARK]) if MARK in meta else None


def _get(server: Server, batch_id: str) -> Row:
    with server.store.read() as conn:
        row = records.get_batch(conn, batch_id, "openai")
    if row is None or _own(row) is None:
        raise ApiError(404, f"batch {batch_id} not found")
    return row


@router.post("/v1/batches", status_code=201, dependencies=[Depends(_keyed)])
async def create(request: Request) -> dict[str, Any]:
    server = _server(request)
    raw = await read_body(request, server.config.max_request_bytes, server.config.body_timeout)
    body = validated(BatchCreate, parse_object(raw, server.config.max_json_depth))
    return await run_in_threadpool(_create, server, body)


def _create(server: Server, body: BatchCreate) -> dict[str, Any]:
    if body.provider != "openai":
        raise ApiError(400, f"This server runs provider openai batches only, not {body.provider!r}.", param="provider")
    if body.endpoint not in ENDPOINTS:
        raise ApiError(400, f"endpoint must be one of {', '.join(ENDPOINTS)} for provider openai.", param="endpoint")
    if body.completion_window != "24h":
        raise ApiError(400, "completion_window must be 24h.", param="completion_window")
    with _creating:
        with server.store.read() as conn:
            for row in records.list_batches(conn, "openai", 1_000_000)[0]:
                own = _own(row)
                if own is not None and own["request_id"] == body.request_id:
                    return batch_json(server, row)  # the same request_id: the batch it made, nothing new
            if records.get_file(conn, body.file_id) is None:
                raise ApiError(400, f"file {body.file_id} has not been uploaded: PUT it to its upload_url first.", param="file_id")
        now = server.clock.now()
        batch_id = str(uuid.uuid4())
        own = {"provider": body.provider, "request_id": body.request_id}
        with server.store.begin() as conn:
            records.insert_batch(
                conn, id=batch_id, api="openai", endpoint=body.endpoint, input_file_id=body.file_id,
                completion_window=body.completion_window, metadata=json.dumps((body.metadata or {}) | {MARK: json.dumps(own)}),
                jobs=[], faults=server.faults.for_batch("openai"), total=0, rejected=0, created_at=now,
                expires_at=now + server.config.completion_window,
            )  # fmt: skip
            row = records.get_batch(conn, batch_id)
    server.notify()
    return batch_json(server, row)


@router.get("/v1/batches/{batch_id}", dependencies=[Depends(_keyed)])
def get(batch_id: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    return batch_json(server, _get(server, batch_id))


@router.get("/v1/batches", dependencies=[Depends(_keyed)])
def list_(request: Request, after: str | None = None, limit: int = 20, status: str | None = None) -> dict[str, Any]:
    """Newest first, a page after the batch `after` (the previous page's `last_id`)."""
    server = _server(request)
    if not 1 <= limit <= 100:
        raise ApiError(400, "limit must be between 1 and 100.", param="limit")
    with server.store.read() as conn:
        rows = [r for r in records.list_batches(conn, "openai", 1_000_000)[0] if _own(r) is not None]
    rows = [r for r in rows if status is None or r.status == status]
    if after is not None:
        ids = [r.id for r in rows]
        rows = rows[ids.index(after) + 1 :] if after in ids else []
    shown = rows[:limit]
    return {"data": [batch_json(server, r) for r in shown], "has_more": len(rows) > limit,
            "first_id": shown[0].id if shown else None, "last_id": shown[-1].id if shown else None}  # fmt: skip


@router.post("/v1/batches/{batch_id}/cancel", dependencies=[Depends(_keyed)])
def cancel(batch_id: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    status = records.begin_cancel(server, batch_id, lambda: S(_get(server, batch_id).status))
    if status in TERMINAL or status is S.FINALIZING:
        raise ApiError(409, f"Cannot cancel a batch with status {status.value}.")
    return batch_json(server, _get(server, batch_id))


@router.get("/v1/batches/{batch_id}/results", dependencies=[Depends(_keyed)])
def results(batch_id: str, request: Request) -> dict[str, Any]:
    """Short-lived download links for an ended batch's output and error files."""
    server = _server(request)
    row = _get(server, batch_id)
    if S(row.status) not in TERMINAL:
        return {"batch_id": batch_id, "result_available": False, "output_file_url": None, "error_file_url": None, "expires_at": None}
    links = {kind: _presigned(request, file_id) if file_id else None
             for kind, file_id in (("output", row.output_file_id), ("error", row.error_file_id))}  # fmt: skip
    expires = next((e for _, e in filter(None, links.values())), None)
    return {"batch_id": batch_id, "result_available": True, "output_file_url": links["output"] and links["output"][0],
            "error_file_url": links["error"] and links["error"][0], "expires_at": _iso(expires)}  # fmt: skip
