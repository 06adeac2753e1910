"""OpenRouter's Batch API (`/api/v1/batches`), as the official `openrouter` SDK calls it.

    POST   /api/v1/batches              inline: {"endpoint", "model", "requests": [{"custom_id", "body"}]} → 202, validating
    GET    /api/v1/batches              newest first; limit, after, status, created_after, created_before
    GET    /api/v1/batches/{id}         status and counts; `results` once ended, one per request
    POST   /api/v1/batches/{id}/cancel  in OpenRouter's API reference (the SDK has no method for it)
    DELETE /api/v1/batches/{id}         an ended batch only (409 otherwise)

As OpenRouter says it does: `endpoint` and `model` must come before `requests` (400
otherwise: the API parses the body as a stream), a request's body may leave out `model` (it
inherits the batch's) but not name another, at most 5,000 requests and 200 MB. The body is
read whole here (200 MB at most). A request the backend refuses fails alone, as an error
result. Errors are in OpenRouter's shape, `{"error": {"code", "message"}}` (errors.py).
A batch runs as a lowtide job like the other APIs' (lifecycle.py), and `build_openrouter`
writes its results once it ends.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import Row
from starlette.concurrency import run_in_threadpool

from lowtide.core import fastjson
from lowtide.core.endpoints import CHAT, EMBEDDINGS, MESSAGES, RESPONSES
from lowtide.server import records, safejson
from lowtide.server.billing import Bill
from lowtide.server.bodies import stream_body
from lowtide.server.context import Server
from lowtide.server.errors import ApiError
from lowtide.server.faults import line_fates
from lowtide.server.finalize import LONE_SURROGATES, Summary, _count, batch_folder, live_summary
from lowtide.server.intake import Intake
from lowtide.server.outputs import Result, openai_line, results
from lowtide.server.records import TERMINAL
from lowtide.server.records import BatchStatus as S

router = APIRouter(prefix="/api/v1/batches")
API = "openrouter"
ENDPOINTS = (CHAT, RESPONSES, MESSAGES, EMBEDDINGS)
MAX_REQUESTS = 5_000
MAX_BYTES = 200 * 1024 * 1024
RESULTS = "openrouter_results.jsonl"
# A failed request's error as OpenRouter words it: (type, canonical error_type) by HTTP status.
ERROR_TYPES = {400: ("invalid_request_error", "invalid_request"), 404: ("not_found_error", "not_found"),
               429: ("rate_limit_exceeded", "rate_limit_exceeded")}  # fmt: skip


def _server(request: Request) -> Server:
    return request.app.state.server


@router.post("", status_code=202)
async def create(request: Request) -> dict[str, Any]:
    server = _server(request)
    raw = bytearray()
    async for chunk in stream_body(request, MAX_BYTES, server.config.body_timeout):
        raw += chunk
    batch_id = records.new_id("batch_", 26)
    row = await run_in_threadpool(_take, server, batch_id, bytes(raw))
    server.notify()
    return batch_object(server, row)


def _take(server: Server, batch_id: str, raw: bytes) -> Row:
    """Check the body as OpenRouter does, write its requests as the job's rows, store the batch."""
    try:
        body = safejson.loads(raw, server.config.max_json_depth)
    except ValueError as err:
        raise ApiError(400, f"The request body is not valid JSON ({err}).") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    keys = list(body)
    if "requests" in keys and any(
        k in keys[keys.index("requests") + 1 :] for k in ("endpoint", "model")
    ):
        raise ApiError(
            400, "`endpoint` and `model` must appear before `requests` in the request body."
        )
    endpoint, model, entries = body.get("endpoint"), body.get("model"), body.get("requests")
    if endpoint not in ENDPOINTS:
        raise ApiError(400, f"endpoint: must be one of {', '.join(ENDPOINTS)}; got {endpoint!r}.")
    if not isinstance(model, str) or not model or "\x00" in model:
        raise ApiError(400, "model: Field required (a model slug).")
    if not isinstance(entries, list) or not entries:
        raise ApiError(400, "requests: must be a non-empty array.")
    if len(entries) > MAX_REQUESTS:
        raise ApiError(
            400,
            f"requests: a batch may have at most {MAX_REQUESTS:,} requests; this one has {len(entries):,}.",
        )
    if body.get("completion_window", "24h") != "24h":
        raise ApiError(400, "completion_window: the only supported completion window is 24h.")
    provider = body.get("provider")
    if provider is not None and (
        not isinstance(provider, dict) or set(provider) - {"only", "allow_fallbacks"}
    ):
        raise ApiError(
            400,
            "provider: only provider.only and provider.allow_fallbacks are supported in a batch.",
        )
    refuse = server.refuse(endpoint, "anthropic" if endpoint == MESSAGES else "openai")
    seen: set[str] = set()
    with Intake(batch_folder(server, batch_id), batch_id) as intake:
        try:
            for i, entry in enumerate(entries):
                custom_id, params = _entry(i, entry, model, seen)
                intake.add(custom_id, model, refuse(params) or {"body": params})
        except ApiError:
            intake.discard()
            raise
    now = server.clock.now()
    jobs = [{"name": j["name"], "model": j["model"]} for j in intake.jobs.values()]
    with server.store.begin() as conn:
        records.insert_batch(
            conn, id=batch_id, api=API, endpoint=endpoint, model=model, completion_window="24h", jobs=jobs,
            faults=server.faults.for_batch(API), total=intake.total, rejected=intake.rejected, created_at=now,
            expires_at=now + server.config.completion_window,
        )  # fmt: skip
        return records.get_batch(conn, batch_id)


def _entry(i: int, entry: Any, model: str, seen: set[str]) -> tuple[str, dict[str, Any]]:
    where = f"requests[{i}]"
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("custom_id"), str)
        or not isinstance(entry.get("body"), dict)
    ):
        raise ApiError(
            400, f"{where}: each request needs a custom_id (text) and a body (an object)."
        )
    custom_id, params = entry["custom_id"], entry["body"]
    if custom_id in seen:
        raise ApiError(
            400,
            f"{where}.custom_id: '{custom_id}' is used more than once; each request needs its own.",
        )
    seen.add(custom_id)
    if "model" in params and params["model"] != model:
        raise ApiError(
            400,
            f"{where}.body.model: '{params['model']}' differs from the batch's model '{model}'; leave it out or make it match.",
        )
    return custom_id, params if "model" in params else {
        "model": model,
        **params,
    }  # it inherits the batch's


@router.get("/{batch_id}")
def retrieve(batch_id: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    return batch_object(server, _get(server, batch_id), with_results=True)


@router.get("")
def list_(request: Request) -> dict[str, Any]:
    server = _server(request)
    query = request.query_params
    try:
        limit = int(query.get("limit", 20))
        after_t, before_t = _time(query.get("created_after")), _time(query.get("created_before"))
    except ValueError:
        raise ApiError(
            400,
            "limit must be a whole number; created_after and created_before timestamps like 2026-08-20T00:00:00Z.",
        ) from None
    if not 1 <= limit <= 100:
        raise ApiError(400, f"limit: must be from 1 through 100; got {limit}.")
    wanted = set(query.getlist("status"))
    data: list[dict[str, Any]] = []
    after = query.get("after")
    more = True
    with server.store.read() as conn:
        while more and len(data) <= limit:  # pages of the store, filtered here
            page = records.list_batches(conn, API, limit, after=after)
            if page is None:
                raise ApiError(404, f"No batch found with id '{after}'.")
            rows, more = page
            for row in rows:
                after = row.id
                if (wanted and row.status not in wanted) or (
                    before_t is not None and row.created_at >= before_t
                ):
                    continue
                if (
                    after_t is not None and row.created_at <= after_t
                ):  # newest first: the rest are older
                    more = False
                    break
                data.append(batch_object(server, row))
    has_more = len(data) > limit or more
    data = data[:limit]
    return {"object": "list", "data": data, "has_more": has_more,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data and has_more else None}  # fmt: skip


def _time(text: str | None) -> float | None:
    """A timestamp as the SDK sends one (ISO 8601, or a date), in Unix seconds."""
    if text is None:
        return None
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@router.post("/{batch_id}/cancel")
def cancel(batch_id: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    status = records.begin_cancel(server, batch_id, lambda: S(_get(server, batch_id).status))
    if status in TERMINAL:
        raise ApiError(
            409, f"Batch {batch_id} has already ended ({status.value}); it cannot be cancelled."
        )
    return batch_object(server, _get(server, batch_id))


@router.delete("/{batch_id}")
def delete(batch_id: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    row = _get(server, batch_id)
    if row.status not in TERMINAL:
        raise ApiError(
            409,
            f"Batch {batch_id} is still {row.status}; only a completed, failed, expired or cancelled batch can be deleted.",
        )
    with server.store.begin() as conn:
        records.delete_batch(conn, batch_id)
    shutil.rmtree(batch_folder(server, batch_id), ignore_errors=True)
    upstream = {
        "provider": server.config.backend,
        "status": "deleted",
    }  # serve's folder of the batch
    return {
        "id": batch_id,
        "object": "batch",
        "deletion": {"openrouter": "deleted", "upstream": upstream},
    }


def _get(server: Server, batch_id: str) -> Row:
    with server.store.read() as conn:
        row = records.get_batch(conn, batch_id, API)
    if row is None:
        raise ApiError(404, f"No batch found with id '{batch_id}'.")
    return row


def batch_object(server: Server, row: Row, with_results: bool = False) -> dict[str, Any]:
    """A batch as OpenRouter's `GET /batches/{id}` shows it (a list item: `results` null)."""
    ended = row.status in TERMINAL
    if ended and row.counts is not None:
        summary = Summary.from_json(row.counts)
    else:
        with server.store.read() as conn:
            summary = live_summary(conn, row)
    c = summary.counts
    completed = c["succeeded"]
    failed = c["failed"] + c["expired"] + c["cancelled"] if ended else c["failed"]
    error = None
    if row.status == S.FAILED:
        found = json.loads(row.errors or "{}").get("data") or [
            {"message": "the batch failed validation"}
        ]
        error = {"message": "; ".join(e["message"] for e in found)}
    usage = summary.usage
    finalized = row.completed_at or row.failed_at or row.expired_at or row.cancelled_at
    return {
        "id": row.id, "object": "batch", "endpoint": row.endpoint, "model": row.model, "completion_window": "24h",
        "status": row.status, "provider": server.config.backend, "error": error,
        "request_counts": {"completed": completed, "failed": failed, "total": row.total},
        "created_at": int(row.created_at), "expires_at": int(row.expires_at),
        "finalized_at": int(finalized) if finalized is not None else None,
        "usage": {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"],
                  "total_tokens": usage["input_tokens"] + usage["output_tokens"]} if ended else None,
        "results": _results(server, row) if with_results and ended else None,
    }  # fmt: skip


def _results(server: Server, row: Row) -> list[Any]:
    path = batch_folder(server, row.id) / RESULTS
    if not path.exists():  # failed at validation: nothing ran
        return []
    with path.open(encoding="utf-8") as f:
        return [fastjson.loads(line) for line in f if line.strip()]


def build_openrouter(server: Server, row: Row, ending: str) -> dict[str, Any]:
    """Write an ended batch's results, one per request (Worker.end, lifecycle.py)."""
    summary = Summary()
    bill = Bill(row.id, API, server.clock.now())
    folder = batch_folder(server, row.id)
    folder.mkdir(parents=True, exist_ok=True)
    created = int(server.clock.now())
    found = results(server.store, folder, row, records.jobs_of(row), ending, row.endpoint)

    def lines():
        for r in found:
            _count(summary, r)
            yield result_line(row.id, r, created, row.endpoint), r

    with (folder / RESULTS).open("w", encoding="utf-8", errors=LONE_SURROGATES) as f:
        for line, r, fate in line_fates(lines(), records.faults_of(row)):
            bill.note(r, fate)
            # A cut entry (corrupt_lines) goes as a JSON string: `results` is part of one JSON
            # answer, which a line cut in half would break whole, every other entry with it.
            f.write((fastjson.dumps(line) if fate == "corrupt" else line) + "\n")
    return {"values": {"counts": summary.to_json()}, "files": [], "bill": bill.rows()}


def result_line(batch_id: str, r: Result, created: int, endpoint: str) -> str:
    """One entry of `results`: OpenAI's output line for an answer; for a failure, no
    response and an error `{"message", "param", "type", "error_type"}`."""
    if r.kind == "succeeded":
        line = openai_line(batch_id, r, created, endpoint)[0]
        if endpoint != CHAT:
            return line
        answer = fastjson.loads(line)
        for choice in (
            answer["response"]["body"].get("choices") or []
        ):  # OpenRouter's: the upstream's own word
            choice.setdefault("native_finish_reason", choice.get("finish_reason"))
        return fastjson.dumps(answer)
    line = fastjson.loads(openai_line(batch_id, r, created, endpoint)[0])
    if r.kind == "failed" and r.status is not None:
        kind, canonical = ERROR_TYPES.get(r.status) or (
            ("server_error", "server")
            if r.status >= 500
            else ("invalid_request_error", "invalid_request")
        )
        error = {"message": r.message, "param": r.param, "type": kind, "error_type": canonical}
    elif r.kind == "failed":
        error = {"message": r.message, "param": None, "type": "timeout", "error_type": "timeout"}
    else:  # expired or cancelled before it ran
        error = {"message": line["error"]["message"], "param": None, "type": line["error"]["code"]}
    return fastjson.dumps(
        {"id": line["id"], "custom_id": r.custom_id, "response": None, "error": error}
    )
