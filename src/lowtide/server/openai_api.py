"""OpenAI's Batch API: create, retrieve, list, cancel (`/v1/batches`)."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Row
from starlette.concurrency import run_in_threadpool

from lowtide.core.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, MODERATIONS, RESPONSES
from lowtide.server import records, together_batches
from lowtide.server.bodies import parse_object, read_body
from lowtide.server.context import Server
from lowtide.server.errors import ApiError, not_found
from lowtide.server.files import BATCH_PURPOSES
from lowtide.server.finalize import Summary, live_summary
from lowtide.server.records import TERMINAL
from lowtide.server.records import BatchStatus as S
from lowtide.server.schemas import json_body, validated

router = APIRouter(prefix="/v1/batches")
ENDPOINTS = ("/v1/responses", "/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/moderations",
             "/v1/images/generations", "/v1/images/edits", "/v1/videos")  # fmt: skip
SUPPORTED = (CHAT, RESPONSES, COMPLETIONS, EMBEDDINGS, MODERATIONS)  # the rest (images, videos) are another issue's
LIVE_COUNTS_AGE = 1.0  # real seconds
STAMPS = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
          "expired_at", "cancelling_at", "cancelled_at")  # fmt: skip


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="allow")
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: dict[str, Any] | None = None


def batch_object(server: Server, row: Row) -> dict[str, Any]:
    if row.counts is not None:
        server.live_counts.pop(row.id, None)
        summary = Summary.from_json(row.counts)
    else:
        summary = _live_summary(server, row)
    c, u = summary.counts, summary.usage
    ended = row.counts is not None
    total = sum(c.values()) if ended else row.total
    obj: dict[str, Any] = {
        "id": row.id, "object": "batch", "endpoint": row.endpoint, "model": row.model,
        "errors": json.loads(row.errors) if row.errors else None, "input_file_id": row.input_file_id,
        "completion_window": row.completion_window, "status": row.status,
        "output_file_id": row.output_file_id, "error_file_id": row.error_file_id,
    }  # fmt: skip
    obj.update({k: int(getattr(row, k)) if getattr(row, k) is not None else None for k in STAMPS})
    failed = total - c["succeeded"] if ended else c["failed"]  # at the end: every line of the error file
    obj["request_counts"] = {"total": total, "completed": c["succeeded"], "failed": failed}
    obj["usage"] = {
        "input_tokens": u["input_tokens"], "input_tokens_details": {"cached_tokens": u["cached_input_tokens"]},
        "output_tokens": u["output_tokens"], "output_tokens_details": {"reasoning_tokens": u["reasoning_tokens"]},
        "total_tokens": u["input_tokens"] + u["output_tokens"],
    }  # fmt: skip
    obj["metadata"] = json.loads(row.metadata) if row.metadata else None
    return obj


def _live_summary(server: Server, row: Row) -> Summary:
    """A running batch's counts, at most LIVE_COUNTS_AGE real seconds old (as OpenAI's are
    too: its request_counts lag the work)."""
    now = time.monotonic()
    cached = server.live_counts.get(row.id)
    if cached is not None and now - cached[0] < LIVE_COUNTS_AGE:
        return cached[1]
    with server.store.read() as conn:
        summary = live_summary(conn, row)
    server.live_counts[row.id] = (now, summary)
    return summary


def _server(request: Request) -> Server:
    return request.app.state.server


def _get(server: Server, batch_id: str) -> Row:
    with server.store.read() as conn:
        row = records.get_batch(conn, batch_id, "openai")
    if row is None:
        raise not_found("openai", "batch", batch_id)
    return row


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > 16:
        raise ApiError(400, "Invalid 'metadata': too many properties. Expected an object with at most 16 properties.", param="metadata")
    for key, value in metadata.items():
        if len(key) > 64:
            raise ApiError(400, f"Invalid 'metadata': key '{key[:20]}…' is longer than 64 characters.", param="metadata")
        if len(value) > 512:
            raise ApiError(400, f"Invalid 'metadata.{key}': string too long (the maximum is 512 characters).", param="metadata")


def _output_expiry(value: dict[str, Any] | None) -> float | None:
    """`output_expires_after` as the seconds its output and error files live (None: the
    default); refused in OpenAI's words unless it is {"anchor": "created_at", "seconds": N}."""
    if value is None:
        return None
    anchor, seconds = value.get("anchor"), value.get("seconds")
    if anchor != "created_at":
        raise ApiError(400, f"Invalid 'output_expires_after.anchor': expected 'created_at', but got {anchor!r}.",
                       param="output_expires_after.anchor")  # fmt: skip
    if type(seconds) is not int:
        raise ApiError(400, f"Invalid type for 'output_expires_after.seconds': expected an integer, but got {type(seconds).__name__}.",
                       param="output_expires_after.seconds")  # fmt: skip
    if not 3600 <= seconds <= 2_592_000:
        raise ApiError(400, f"Invalid 'output_expires_after.seconds': {seconds}; it must be between 3600 (1 hour) and 2592000 (30 days).",
                       param="output_expires_after.seconds")  # fmt: skip
    unknown = sorted(set(value) - {"anchor", "seconds"})
    if unknown:
        raise ApiError(400, f"Unknown parameter: 'output_expires_after.{unknown[0]}'.", param=f"output_expires_after.{unknown[0]}")
    return float(seconds)


@router.post("", openapi_extra=json_body(BatchCreate.model_json_schema()))
async def create(request: Request) -> dict[str, Any]:
    server = _server(request)
    config = server.config
    raw = await read_body(request, config.max_request_bytes, config.body_timeout)
    body = validated(BatchCreate, parse_object(raw, config.max_json_depth))
    return await run_in_threadpool(_create, server, body)


def _create(server: Server, body: BatchCreate) -> dict[str, Any]:
    if body.completion_window != "24h":
        raise ApiError(400, f"Invalid completion_window '{body.completion_window}': only '24h' is supported.", param="completion_window")
    if body.endpoint not in ENDPOINTS:
        raise ApiError(400, f"Invalid endpoint '{body.endpoint}': use one of {', '.join(ENDPOINTS)}.", param="endpoint")
    if body.endpoint not in SUPPORTED:
        raise ApiError(400, f"This server runs {', '.join(SUPPORTED)} batches only, not {body.endpoint}.", param="endpoint")
    _check_metadata(body.metadata)
    keep = _output_expiry(body.output_expires_after)
    now = server.clock.now()
    batch_id = records.new_id("batch_", 32)
    with server.store.begin() as conn:
        file = records.get_file(conn, body.input_file_id, "openai")
        if file is None:
            raise not_found("openai", "file", body.input_file_id)
        if file.purpose not in BATCH_PURPOSES:
            raise ApiError(400, f"The file {file.id} has purpose '{file.purpose}'; a batch needs a file uploaded with purpose 'batch'.", param="input_file_id")
        records.insert_batch(
            conn, id=batch_id, api="openai", endpoint=body.endpoint, input_file_id=body.input_file_id,
            completion_window=body.completion_window, metadata=json.dumps(body.metadata) if body.metadata else None,
            jobs=[], faults=server.faults.for_batch("openai"), total=0, rejected=0, created_at=now,
            expires_at=now + server.config.completion_window, output_expires_after=keep,
        )  # fmt: skip
        row = records.get_batch(conn, batch_id)
    server.notify()
    if file.purpose == together_batches.PURPOSE:  # Together's batch: its create wraps the job
        return {"job": together_batches.job(batch_object(server, row), file.bytes)}
    return batch_object(server, row)


@router.get("/{batch_id}")
def retrieve(batch_id: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    row = _get(server, batch_id)
    with server.store.read() as conn:
        file = records.get_file(conn, row.input_file_id)
    if file is not None and file.purpose == together_batches.PURPOSE:  # Together's batch, in its shape
        return together_batches.job(batch_object(server, row), file.bytes)
    return batch_object(server, row)


@router.get("")
def list_(request: Request, after: str | None = None, limit: int = 20) -> dict[str, Any]:
    server = _server(request)
    if not 1 <= limit <= 100:
        raise ApiError(400, f"Invalid 'limit': {limit}; use 1 to 100.", param="limit")
    with server.store.read() as conn:
        page = records.list_batches(conn, "openai", limit, after=after)
    if page is None:
        raise not_found("openai", "batch", after or "")
    rows, more = page
    data = [batch_object(server, r) for r in rows]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}  # fmt: skip


@router.post("/{batch_id}/cancel")
def cancel(batch_id: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    status = records.begin_cancel(server, batch_id, lambda: S(_get(server, batch_id).status))
    if status in TERMINAL or status is S.FINALIZING:
        raise ApiError(400, f"Cannot cancel a batch with status '{status.value}'.")
    return batch_object(server, _get(server, batch_id))
