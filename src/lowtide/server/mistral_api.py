"""Mistral's batch API, under `/mistral`: the `mistralai` SDK pointed at
`server_url="http://HOST:PORT/mistral"` uploads, creates, polls, lists, cancels and downloads
as it does at https://api.mistral.ai (`/v1/files`, `/v1/batch/jobs`, `.../cancel`,
`/v1/files/{id}/content`), with the key as `Authorization: Bearer` (app.py's key check).

Why a prefix: Mistral's `/v1/files` is OpenAI's path with another file object (Mistral's SDK
requires `sample_type` and `source`), so the two cannot share it. `moved` (through azure_paths.MovedPaths) moves
`/mistral/v1/files…` to `/v1/files/mistral…` (the guard takes uploads there as it takes
OpenAI's) and the rest of `/mistral/v1/…` to `/v1/mistral/…`, before anything else sees
them: the key check, the fault plan (`match: "POST /v1/mistral/batch/jobs"`) and routing.

A Mistral job runs as one of serve's OpenAI batches (the same worker, backend, fault plan and
output files): its `{"custom_id", "body"}` lines are written as OpenAI lines to the job's
endpoint, with the job's model where a body names none; the job's own fields ride in the
batch's metadata under MARK and are shown the Mistral way. OpenAI's `/v1/batches` lists
these batches too. Output and error lines are OpenAI's shape, as Mistral writes them.
`timeout_hours` sets when the batch expires: TIMEOUT_EXCEEDED, answered lines kept.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Row
from starlette.concurrency import run_in_threadpool

from lowtide.core.endpoints import CHAT, EMBEDDINGS, MODERATIONS
from lowtide.server import files, records
from lowtide.server.bodies import parse_object, read_body
from lowtide.server.context import Server
from lowtide.server.errors import ApiError, not_found
from lowtide.server.openai_api import batch_object
from lowtide.server.records import TERMINAL
from lowtide.server.records import BatchStatus as S
from lowtide.server.schemas import validated

PREFIX = "/mistral/v1/"
MARK = "lowtide_serve_mistral"  # the metadata key a Mistral job's own fields ride under
ENDPOINTS = (CHAT, EMBEDDINGS, MODERATIONS)  # what serve runs of Mistral's APIEndpoint
STATUS = {S.VALIDATING: "QUEUED", S.IN_PROGRESS: "RUNNING", S.FINALIZING: "RUNNING", S.COMPLETED: "SUCCESS",
          S.FAILED: "FAILED", S.EXPIRED: "TIMEOUT_EXCEEDED", S.CANCELLING: "CANCELLATION_REQUESTED",
          S.CANCELLED: "CANCELLED"}  # fmt: skip
_FILES = re.compile(r"^/mistral/v1/files(?=/|$)")
LIST_QUERY = {"page", "page_size", "model", "agent_id", "created_after", "created_by_me", "status", "order_by"}

files_router = APIRouter(prefix="/v1/files/mistral")
jobs_router = APIRouter(prefix="/v1/mistral/batch/jobs")


def moved(path: str) -> str:
    """Serve's path for a Mistral one."""
    if _FILES.match(path):
        return _FILES.sub("/v1/files/mistral", path, count=1)
    return "/v1/mistral/" + path.removeprefix(PREFIX)


def _server(request: Request) -> Server:
    return request.app.state.server


# Files ------------------------------------------------------------------------------------
def file_object(openai: dict[str, Any]) -> dict[str, Any]:
    """Mistral's file object (its SDK requires `sample_type` and `source`) for a stored file."""
    return {"id": openai["id"], "object": "file", "bytes": openai["bytes"], "created_at": openai["created_at"],
            "filename": openai["filename"], "purpose": openai["purpose"], "expires_at": openai["expires_at"],
            "sample_type": "batch_result" if openai["purpose"] == "batch_output" else "batch_request",
            "source": "mistral" if openai["purpose"] == "batch_output" else "upload"}  # fmt: skip


@files_router.post("")
async def upload(request: Request) -> dict[str, Any]:
    """Stored as OpenAI's uploads are (streamed, limits, purpose `batch`); answered Mistral's way."""
    return file_object(await files.upload(request))


@files_router.get("/{file_id}")
def retrieve(file_id: str, request: Request) -> dict[str, Any]:
    return file_object(files.retrieve(file_id, request))


@files_router.get("/{file_id}/content")
def content(file_id: str, request: Request):
    return files.content(file_id, request)


@files_router.delete("/{file_id}")
def delete(file_id: str, request: Request) -> dict[str, Any]:
    return files.delete(file_id, request)


# Batch jobs -------------------------------------------------------------------------------
class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    endpoint: str
    input_files: list[str] | None = None
    requests: list[dict[str, Any]] | None = None
    model: str | None = None
    agent_id: str | None = None
    metadata: dict[str, str] | None = None
    timeout_hours: int = 24


def job_object(server: Server, row: Row, inline: bool = False) -> dict[str, Any]:
    """A serve batch as Mistral's BatchJob."""
    batch = batch_object(server, row)
    own = json.loads(batch["metadata"].pop(MARK))
    counts = batch["request_counts"]
    errors = json.loads(row.errors)["data"] if row.errors else []
    status = S(row.status)
    ended = batch.get(f"{status.value}_at") if status in TERMINAL else None
    job = {
        "id": row.id, "object": "batch", "input_files": own["input_files"], "endpoint": row.endpoint, "model": own["model"],
        "agent_id": None, "metadata": batch["metadata"] or None, "status": STATUS[status],
        "errors": [{"message": f"line {e['line']}: {e['message']}" if e.get("line") else e["message"], "count": 1} for e in errors],
        "output_file": row.output_file_id, "error_file": row.error_file_id, "created_at": batch["created_at"],
        "started_at": batch["in_progress_at"], "completed_at": ended, "total_requests": counts["total"],
        "completed_requests": counts["completed"] + counts["failed"], "succeeded_requests": counts["completed"],
        "failed_requests": counts["failed"],
    }  # fmt: skip
    if inline and row.output_file_id:
        with server.store.read() as conn:
            path = server.path(records.get_file(conn, row.output_file_id).path)
        job["outputs"] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return job


def _get(server: Server, job_id: str) -> Row:
    with server.store.read() as conn:
        row = records.get_batch(conn, job_id, "openai")
    if row is None or MARK not in json.loads(row.metadata or "{}"):
        raise not_found("openai", "batch job", job_id)
    return row


@jobs_router.post("")
async def create(request: Request) -> dict[str, Any]:
    server = _server(request)
    config = server.config
    raw = await read_body(request, config.max_request_bytes, config.body_timeout)
    body = validated(JobCreate, parse_object(raw, config.max_json_depth))
    return await run_in_threadpool(_create, server, body)


def _create(server: Server, body: JobCreate) -> dict[str, Any]:
    if body.endpoint not in ENDPOINTS:
        raise ApiError(400, f"This server runs {', '.join(ENDPOINTS)} batch jobs only, not {body.endpoint}.", param="endpoint")
    if not body.model:
        raise ApiError(400, "model is required (agents are not served here).", param="model")
    if bool(body.input_files) == bool(body.requests):
        raise ApiError(400, "Give either input_files or requests.", param="input_files")
    if not 1 <= body.timeout_hours <= 168:
        raise ApiError(400, f"timeout_hours must be between 1 and 168, not {body.timeout_hours}.", param="timeout_hours")
    now = server.clock.now()
    job_id = str(uuid.uuid4())  # Mistral's job ids are UUIDs
    relative = f"files/{job_id}.mistral.jsonl"
    server.path("files").mkdir(parents=True, exist_ok=True)
    lines = 0
    with server.store.begin() as conn, server.path(relative).open("w") as out:
        for line in _lines(server, conn, body):
            out.write(_openai_line(line, body.endpoint, body.model) + "\n")
            lines += 1
        out.flush()
        size = server.path(relative).stat().st_size
        file_id = records.new_id("file-")
        records.insert_file(conn, id=file_id, purpose="batch", filename=f"{job_id}.jsonl", bytes=size, path=relative,
                            created_at=now, expires_at=None)  # fmt: skip
        own = {"input_files": body.input_files or [], "model": body.model}
        records.insert_batch(
            conn, id=job_id, api="openai", endpoint=body.endpoint, model=body.model, input_file_id=file_id,
            completion_window=f"{body.timeout_hours}h", metadata=json.dumps((body.metadata or {}) | {MARK: json.dumps(own)}),
            jobs=[], faults=server.faults.for_batch("openai"), total=0, rejected=0, created_at=now,
            expires_at=now + body.timeout_hours * 3600,
        )  # fmt: skip
        row = records.get_batch(conn, job_id)
    server.notify()
    return job_object(server, row)


def _lines(server: Server, conn: Any, body: JobCreate):
    """The job's request lines: its inline requests, or each input file's lines as they are."""
    if body.requests:
        yield from (json.dumps(r) for r in body.requests)
        return
    for file_id in body.input_files or []:
        file = records.get_file(conn, file_id, "openai")
        if file is None or file.purpose not in files.BATCH_PURPOSES:
            raise not_found("openai", "batch input file", file_id)
        with server.path(file.path).open() as f:
            yield from (line for line in f if line.strip())


def _openai_line(text: str, endpoint: str, model: str) -> str:
    """A Mistral line as the OpenAI line serve's batches run; one that is not a JSON object with
    a `body` object goes as it came, and fails validation the way a bad OpenAI line does."""
    try:
        line = json.loads(text)
    except ValueError:
        return text.strip()
    if not isinstance(line, dict) or not isinstance(line.get("body"), dict):
        return text.strip()
    return json.dumps({"custom_id": line.get("custom_id"), "method": "POST", "url": endpoint,
                       "body": {"model": model} | line["body"]})  # fmt: skip


@jobs_router.get("/{job_id}")
def get(job_id: str, request: Request, inline: bool = False) -> dict[str, Any]:
    server = _server(request)
    return job_object(server, _get(server, job_id), inline)


@jobs_router.get("")
def list_(request: Request, page: int = 0, page_size: int = 100, model: str | None = None, order_by: str = "-created") -> dict[str, Any]:
    """Newest first (or `created`); `status` may repeat. Query keys Mistral's SDK does not name
    are its `metadata` filter, which the SDK sends exploded (`?lowtide_key=…`)."""
    server = _server(request)
    statuses = set(request.query_params.getlist("status"))
    wanted = {k: v for k, v in request.query_params.items() if k not in LIST_QUERY}
    with server.store.read() as conn:
        rows = records.list_batches(conn, "openai", 1_000_000)[0]
    jobs = []
    for row in rows:
        meta = json.loads(row.metadata or "{}")
        if MARK not in meta or (model and json.loads(meta[MARK])["model"] != model):
            continue
        if any(meta.get(k) != v for k, v in wanted.items()) or (statuses and STATUS[S(row.status)] not in statuses):
            continue
        jobs.append(row)
    if order_by == "created":
        jobs.reverse()
    shown = jobs[page * page_size : (page + 1) * page_size]
    return {"object": "list", "total": len(jobs), "data": [job_object(server, r) for r in shown]}


@jobs_router.post("/{job_id}/cancel")
def cancel(job_id: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    status = records.begin_cancel(server, job_id, lambda: S(_get(server, job_id).status))
    if status in TERMINAL or status is S.FINALIZING:
        raise ApiError(400, f"Cannot cancel a batch job with status {STATUS[status]}.")
    return job_object(server, _get(server, job_id))
