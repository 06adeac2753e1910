"""Anthropic's Message Batches API (`/v1/messages/batches`)."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse
from sqlalchemy import Row
from starlette.concurrency import run_in_threadpool

from lowtide.core.endpoints import MESSAGES
from lowtide.server import records
from lowtide.server.bodies import stream_body
from lowtide.server.context import Server
from lowtide.server.errors import ApiError, not_found
from lowtide.server.finalize import Summary, batch_folder
from lowtide.server.intake import Intake
from lowtide.server.message_intake import MessageIntake
from lowtide.server.records import TERMINAL
from lowtide.server.records import BatchStatus as S
from lowtide.server.schemas import MESSAGE_BATCH, json_body

router = APIRouter(prefix="/v1/messages/batches")
FEED_BYTES = 1024 * 1024


def _rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def processing_status(status: str) -> str:
    if status in TERMINAL:
        return "ended"
    return "canceling" if status == S.CANCELLING else "in_progress"


def message_batch(row: Row, base_url: str) -> dict[str, Any]:
    ended = row.status in TERMINAL
    if ended and row.counts is not None:
        c = Summary.from_json(row.counts).counts
        counts = {"processing": 0, "succeeded": c["succeeded"], "errored": c["failed"],
                  "canceled": c["cancelled"], "expired": c["expired"]}  # fmt: skip
    else:  # counts other than processing stay 0 until the batch ends
        counts = {"processing": row.total, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    ended_at = row.completed_at or row.cancelled_at or row.expired_at or row.failed_at
    return {
        "id": row.id, "type": "message_batch", "processing_status": processing_status(row.status),
        "request_counts": counts, "ended_at": _rfc3339(ended_at), "created_at": _rfc3339(row.created_at),
        "expires_at": _rfc3339(row.expires_at), "archived_at": None,
        "cancel_initiated_at": _rfc3339(row.cancelling_at),
        "results_url": f"{base_url}/v1/messages/batches/{row.id}/results" if ended else None,
    }  # fmt: skip


def _server(request: Request) -> Server:
    return request.app.state.server


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _get(server: Server, batch_id: str) -> Row:
    with server.store.read() as conn:
        row = records.get_batch(conn, batch_id, "anthropic")
    if row is None:
        raise not_found("anthropic", "message batch", batch_id)
    return row


@router.post("", openapi_extra=json_body(MESSAGE_BATCH))
async def create(request: Request) -> dict[str, Any]:
    """The body is taken in as it arrives, request by request (message_intake.py)."""
    server = _server(request)
    config = server.config
    batch_id = records.new_id("msgbatch_01", 22)
    taking = await run_in_threadpool(MessageIntake, batch_folder(server, batch_id), batch_id, config.anthropic_max_requests,
                                     config.max_json_depth, server.refuse(MESSAGES, "anthropic"))  # fmt: skip
    try:
        pending = bytearray()
        async for chunk in stream_body(request, config.anthropic_max_bytes, config.body_timeout):
            pending += chunk
            if len(pending) >= FEED_BYTES:  # one thread hop per megabyte, not per network read
                await run_in_threadpool(taking.feed, bytes(pending))
                pending.clear()
        await run_in_threadpool(taking.feed, bytes(pending))
        intake = await run_in_threadpool(taking.finish)
        row = await run_in_threadpool(_store_batch, server, batch_id, intake)
    except BaseException:
        await run_in_threadpool(taking.discard)
        raise
    server.notify()
    return message_batch(row, _base(request))


def _store_batch(server: Server, batch_id: str, intake: Intake) -> Row:
    now = server.clock.now()
    jobs = [{"name": j["name"], "model": j["model"]} for j in intake.jobs.values()]
    with server.store.begin() as conn:
        records.insert_batch(
            conn, id=batch_id, api="anthropic", jobs=jobs, faults=server.faults.for_batch("anthropic"),
            total=intake.total, rejected=intake.rejected, created_at=now,
            expires_at=now + server.config.completion_window,
        )  # fmt: skip
        return records.get_batch(conn, batch_id)


@router.get("/{batch_id}")
def retrieve(batch_id: str, request: Request) -> dict[str, Any]:
    return message_batch(_get(_server(request), batch_id), _base(request))


@router.get("")
def list_(request: Request, after_id: str | None = None, before_id: str | None = None, limit: int = 20) -> dict[str, Any]:
    server = _server(request)
    if not 1 <= limit <= 1000:
        raise ApiError(400, f"limit: Input should be between 1 and 1000; got {limit}")
    if after_id and before_id:
        raise ApiError(400, "give at most one of after_id and before_id")
    with server.store.read() as conn:
        page = records.list_batches(conn, "anthropic", limit, after=after_id, before=before_id)
    if page is None:
        raise not_found("anthropic", "message batch", after_id or before_id or "")
    rows, more = page
    data = [message_batch(r, _base(request)) for r in rows]
    return {"data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}  # fmt: skip


@router.post("/{batch_id}/cancel")
def cancel(batch_id: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    status = records.begin_cancel(server, batch_id, lambda: S(_get(server, batch_id).status))
    if status in TERMINAL:
        raise ApiError(400, f"Message batch {batch_id} has already ended; it cannot be canceled.")
    return message_batch(_get(server, batch_id), _base(request))


@router.delete("/{batch_id}")
def delete(batch_id: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    row = _get(server, batch_id)
    if row.status not in TERMINAL:
        raise ApiError(400, f"Message batch {batch_id} is still being processed; cancel it and wait until it has ended before deleting it.")
    with server.store.begin() as conn:
        records.delete_batch(conn, batch_id)
    shutil.rmtree(batch_folder(server, batch_id), ignore_errors=True)
    return {"id": batch_id, "type": "message_batch_deleted"}


@router.get("/{batch_id}/results")
def results(batch_id: str, request: Request) -> FileResponse:
    server = _server(request)
    row = _get(server, batch_id)
    path = batch_folder(server, batch_id) / "results.jsonl"
    if row.status not in TERMINAL or not path.exists():
        raise ApiError(400, f"Message batch {batch_id} has not ended yet; its results are available once processing_status is 'ended'.")
    return FileResponse(path, media_type="application/binary")
