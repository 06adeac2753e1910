"""Gemini's batch mode and generateContent, as the google-genai SDK calls them:

    POST   /v1beta/models/{model}:batchGenerateContent   {"batch": {"displayName", "inputConfig":
                                                          {"fileName"} | {"requests": {"requests": [...]}}}}
    GET    /v1beta/batches/{id}        GET /v1beta/batches?pageSize=&pageToken=
    POST   /v1beta/batches/{id}:cancel DELETE /v1beta/batches/{id}
    POST   /v1beta/models/{model}:generateContent        (real time, on a direct backend)

A batch is an operation named `batches/<id>` whose `metadata` is the batch (state
`BATCH_STATE_*`, which the SDK reports as `JOB_STATE_*`). An inline list (under 20 MB) is
taken in at create; an uploaded JSONL file (`{"key", "request"}` lines, up to 2 GB) by the
worker after the create has answered (`BATCH_STATE_PENDING` meanwhile; a bad line fails the
batch, `BATCH_STATE_FAILED` with its words), as Gemini answers a create at once: taking 2 GB
in first outlasted a client's read timeout. Either way into the batch's folder as lowtide
source rows (gemini_intake.py, intake.py), and run as lowtide jobs on the
backend like the other APIs' batches (lifecycle.py), with the same clock and fault plan.
A request the backend refuses fails alone, as that key's `error`. Results are matched by
key: an inline batch's `metadata.key` (else a private key), a file line's `key`; an inline
batch answers in its requests' order with their own `metadata` (gemini_outputs.py).
"""

from __future__ import annotations

import json
import secrets
import shutil
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from sqlalchemy import Row
from starlette.concurrency import run_in_threadpool

from lowtide.core import fastjson
from lowtide.core.endpoints import GEMINI
from lowtide.core.types import Request as LowtideRequest
from lowtide.routes.replies import Ids, in_shape, text_body
from lowtide.server import records
from lowtide.server.bodies import parse_object, read_body
from lowtide.server.context import Server
from lowtide.server.errors import ApiError
from lowtide.server.finalize import Summary, batch_folder, live_summary
from lowtide.server.gemini_fields import Mask, apply, mask_of, selects
from lowtide.server.gemini_files import get_file, rfc3339
from lowtide.server.gemini_intake import take
from lowtide.server.gemini_outputs import INLINE, meta_of
from lowtide.server.intake import Intake
from lowtide.server.realtime_api import _backend, _finish, _run
from lowtide.server.records import TERMINAL
from lowtide.server.records import BatchStatus as S
from lowtide.server.translate import Rejection, rejection

router = APIRouter(prefix="/v1beta")
INLINE_MAX_BYTES = 20 * 2**20  # Gemini: inline requests under 20 MB a batch
STATES = {S.VALIDATING: "BATCH_STATE_PENDING", S.IN_PROGRESS: "BATCH_STATE_RUNNING", S.FINALIZING: "BATCH_STATE_RUNNING",
          S.CANCELLING: "BATCH_STATE_RUNNING", S.COMPLETED: "BATCH_STATE_SUCCEEDED", S.FAILED: "BATCH_STATE_FAILED",
          S.EXPIRED: "BATCH_STATE_EXPIRED", S.CANCELLED: "BATCH_STATE_CANCELLED"}  # fmt: skip
BATCH_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"


def _server(request: Request) -> Server:
    return request.app.state.server


def _get(server: Server, name: str) -> Row:
    with server.store.read() as conn:
        row = records.get_batch(conn, name.removeprefix("batches/"), "gemini")
    if row is None:
        raise ApiError(404, f"Batch batches/{name} not found.")
    return row


def batch_object(server: Server, row: Row, mask: Mask | None = None) -> dict[str, Any]:
    """The batch as its operation, with what `mask` keeps (the output, and an inline
    batch's responses in it, only read when kept)."""
    ended = row.status in TERMINAL
    stamps = [t for t in (row.created_at, row.in_progress_at, row.finalizing_at, row.cancelling_at, row.completed_at,
                          row.failed_at, row.expired_at, row.cancelled_at) if t is not None]  # fmt: skip
    if ended and row.counts is not None:
        counts = Summary.from_json(row.counts).counts
    else:
        with server.store.read() as conn:
            counts = live_summary(conn, row).counts
    done = counts["succeeded"] + counts["failed"] + counts["cancelled"] + counts["expired"]
    stats = {"requestCount": str(row.total), "successfulRequestCount": str(counts["succeeded"]),
             "failedRequestCount": str(counts["failed"] + counts["cancelled"] + counts["expired"]),
             "pendingRequestCount": str(0 if ended else max(row.total - done, 0))}  # fmt: skip
    meta = meta_of(row)
    batch: dict[str, Any] = {
        "@type": BATCH_TYPE, "model": f"models/{row.model}", "displayName": meta.get("displayName"),
        "createTime": rfc3339(row.created_at), "updateTime": rfc3339(max(stamps)), "batchStats": stats,
        "state": STATES[S(row.status)], "name": f"batches/{row.id}",
    }  # fmt: skip
    if ended:
        batch["endTime"] = rfc3339(max(stamps))
        if row.status != S.FAILED:
            wanted = selects(mask, "metadata", "output") or selects(mask, "response")
            batch["output"] = _output(server, row, meta) if wanted else {}
    out: dict[str, Any] = {"name": f"batches/{row.id}", "metadata": batch, "done": ended}
    if row.status == S.FAILED:
        errors = json.loads(row.errors)["data"] if row.errors else []
        out["error"] = {"code": 400, "message": "; ".join(e["message"] for e in errors) or "the batch failed", "status": "INVALID_ARGUMENT"}
    elif ended:
        out["response"] = {"@type": BATCH_TYPE.replace("GenerateContentBatch", "GenerateContentBatchOutput")} | batch["output"]
    return apply(mask, out)


def _output(server: Server, row: Row, meta: dict[str, Any]) -> dict[str, Any]:
    if not meta.get("inline"):
        return {"responsesFile": f"files/{row.output_file_id}"} if row.output_file_id else {}
    path = batch_folder(server, row.id) / INLINE
    items = []
    if path.exists():
        with path.open(encoding="utf-8") as f:
            for line in f:
                try:
                    items.append(fastjson.loads(line))
                except ValueError:  # a corrupt line (fault plan): the request has no response
                    continue
    return {"inlinedResponses": {"inlinedResponses": items}}


@router.post("/models/{model}:batchGenerateContent")
async def create(model: str, request: Request) -> Response:
    server = _server(request)
    if "\x00" in model:  # no model has one, and PostgreSQL's text cannot hold it
        raise ApiError(400, "model: it holds a NUL character, which no model name has.")
    raw = await read_body(request, max(server.config.max_request_bytes, INLINE_MAX_BYTES), server.config.body_timeout)
    body = parse_object(raw, server.config.max_json_depth)
    batch = body.get("batch")
    if not isinstance(batch, dict) or not isinstance(batch.get("inputConfig"), dict):
        raise ApiError(400, "batch.inputConfig: Field required (fileName, or requests.requests).")
    source = batch["inputConfig"]
    inline = "requests" in source
    if inline and len(raw) > INLINE_MAX_BYTES:
        raise ApiError(400, f"Inline requests are {len(raw):,} bytes; a batch takes at most {INLINE_MAX_BYTES:,} inline. Upload a JSONL file and give its fileName.")
    batch_id = "lt" + secrets.token_hex(12)
    meta: dict[str, Any] = {"displayName": batch.get("displayName"), "inline": inline}
    if inline:  # under 20 MB: taken in now, a bad request refused with this call's 400
        intake: Intake | None = await run_in_threadpool(take, server, batch_id, model, source)
    else:  # up to 2 GB: answered at once, the file taken in by the worker (validating, as Gemini's PENDING)
        name = source.get("fileName")
        if not isinstance(name, str):
            raise ApiError(400, "batch.inputConfig: give fileName (an uploaded JSONL file) or requests.")
        get_file(server, name)  # no such file: this call's 404
        intake, meta["fileName"] = None, name
    row = await run_in_threadpool(_store, server, batch_id, model, meta, intake)
    server.notify()
    return _json(batch_object(server, row))


def _store(server: Server, batch_id: str, model: str, meta: dict[str, Any], intake: Intake | None) -> Row:
    now = server.clock.now()
    jobs = [{"name": j["name"], "model": j["model"]} for j in intake.jobs.values()] if intake is not None else []
    with server.store.begin() as conn:
        records.insert_batch(
            conn, id=batch_id, api="gemini", endpoint=GEMINI, model=model, metadata=meta, jobs=jobs,
            faults=server.faults.for_batch("gemini"), total=intake.total if intake else 0, rejected=intake.rejected if intake else 0, created_at=now,
            expires_at=now + 2 * server.config.completion_window,  # Gemini: a batch expires after 48 h
        )  # fmt: skip
        return records.get_batch(conn, batch_id)


@router.get("/batches/{name}")
def get(name: str, request: Request) -> Response:
    server = _server(request)
    mask = mask_of(request)
    return _json(batch_object(server, _get(server, name), mask))


@router.get("/batches")
def list_(request: Request, pageSize: int = 50, pageToken: str | None = None) -> Response:  # noqa: N803 (Gemini's names)
    server = _server(request)
    mask = mask_of(request)
    if not 1 <= pageSize <= 1000:
        raise ApiError(400, f"pageSize must be between 1 and 1000; got {pageSize}.")
    with server.store.read() as conn:
        page = records.list_batches(conn, "gemini", pageSize, after=pageToken or None)
    if page is None:
        raise ApiError(400, f"pageToken {pageToken} is not valid.")
    rows, more = page
    each = mask.get("operations", {}) if mask is not None else None  # what each operation keeps
    out: dict[str, Any] = {"operations": [batch_object(server, r, each) for r in rows]}
    if more and rows:
        out["nextPageToken"] = rows[-1].id
    return _json(apply(mask, out))


def _json(value: dict[str, Any]) -> Response:
    # orjson, not FastAPI's encoder: an ended inline batch is 50,000 responses. What orjson
    # refuses (a lone surrogate, an integer past 64 bits) is written escaped, as valid UTF-8.
    try:
        data = orjson.dumps(value)
    except TypeError:
        data = json.dumps(value).encode()
    return Response(data, media_type="application/json")


@router.post("/batches/{name}:cancel")
def cancel(name: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    row = _get(server, name)
    status = records.begin_cancel(server, row.id, lambda: S(_get(server, name).status))
    if status in TERMINAL:
        raise ApiError(400, f"Batch batches/{row.id} has already ended ({STATES[status]}); it cannot be cancelled.")
    return {}


@router.delete("/batches/{name}")
def delete(name: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    row = _get(server, name)
    if row.status not in TERMINAL:
        raise ApiError(400, f"Batch batches/{row.id} is still running; cancel it and wait until it has ended before deleting it.")
    with server.store.begin() as conn:
        records.delete_batch(conn, row.id)
    shutil.rmtree(batch_folder(server, row.id), ignore_errors=True)
    return {}


@router.post("/models/{model}:generateContent")
async def generate_content(model: str, request: Request) -> dict[str, Any]:
    """Real time on the direct backend: the body verbatim, the model the path's."""
    server = _server(request)
    backend = _backend(request, "generateContent")
    raw = await read_body(request, server.config.max_request_bytes, server.config.body_timeout)
    body = parse_object(raw, server.config.max_json_depth) | {"model": model}
    refused: Rejection | None = rejection(server.route, GEMINI, body, server.config.model, "gemini")
    if refused is not None:
        raise ApiError(refused.status, refused.message, param=refused.param)
    sent = body | ({"model": server.config.model} if server.config.model else {})
    outcome = await _run(backend, LowtideRequest(backend.new_id(), GEMINI, sent))
    if in_shape(GEMINI, outcome.response):
        return outcome.response
    asked = LowtideRequest("", GEMINI, body)
    return text_body(asked, outcome.text or "", _finish(outcome, asked.output_limit), outcome.usage,
                     ids=Ids(secrets.token_hex(12)), created=int(server.clock.now()))  # fmt: skip
