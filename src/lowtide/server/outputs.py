"""What a batch produced, read from the `requests` rows of its jobs, written in each
provider's line shapes: OpenAI's output and error files, Anthropic's results.

Each request becomes one `Result`: succeeded, failed (an HTTP error for that request, or a
timeout), cancelled or expired. A succeeded request's answer is the upstream's whole body
when it kept one in the request's endpoint's shape, else built from the text it kept
(`routes/replies.py`, the one answer builder). Requests refused at the
edge (`rejected.jsonl`) fail as HTTP 4xx, naming the field. Files are streamed row page by
row page; nothing is held whole. A page is at most PAGE rows and about PAGE_BYTES of what
they kept (answers, payloads), sized from the page before: 50,000 answers of 16 kB vectors
are read 500 at a time, not 5,000 (serve's peak RSS at bench/maxsize.py's embeddings case).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Connection, Row, Select, select

from lowtide.core import fastjson
from lowtide.core.endpoints import CHAT, COMPLETIONS, MESSAGES
from lowtide.core.states import RequestState
from lowtide.core.types import Request, Usage
from lowtide.routes.replies import Ids, finish_of, in_shape, text_body
from lowtide.server.translate import decode_key
from lowtide.store.bulk import among
from lowtide.store.db import Store
from lowtide.store.payloads import payload_text
from lowtide.store.schema import jobs, requests

PAGE = 5000  # rows a page holds at most
FIRST_PAGE = 16  # rows of the first page, before the size of a row is known (8 MB: rows of 512 kB)
PAGE_BYTES = 8 * 2**20  # about what a page holds of answers, outputs and payloads
_dumps = fastjson.dumps
EXPIRED_CODES = ("deadline_passed", "batch_expired")
TIMEOUT_CODES = ("timeout", "request_timeout")
SUCCEEDED, FAILED = RequestState.SUCCEEDED.value, RequestState.FAILED.value  # plain str: compared per row
# lowtide error codes as (HTTP status, OpenAI error type, OpenAI error code).
HTTP_ERRORS = {
    "invalid_request": (400, "invalid_request_error", None),
    "context_length_exceeded": (400, "invalid_request_error", "context_length_exceeded"),
    "model_not_found": (404, "invalid_request_error", "model_not_found"),
    "rate_limit": (429, "requests", "rate_limit_exceeded"),
    "rate_limited": (429, "requests", "rate_limit_exceeded"),
}
# A kept chat or text completion as ingest wrote it (`fastjson.dumps`, by orjson: compact,
# so the same text as orjson writes what it reads), told by its first keys: an output line
# takes it verbatim with the model named in place, as writing the parsed answer with that
# model would (its value stays where it was), and it is not read. Text the standard
# library wrote (`": "` after a key) is not told so, and is read as before.
_KEPT_HEADS = {
    endpoint: re.compile(r'\{"id":"[^"\\]*","object":"' + re.escape(kind) + r'","created":-?[0-9]+,"model":("(?:[^"\\]|\\.)*")')
    for endpoint, kind in ((CHAT, "chat.completion"), (COMPLETIONS, "text_completion"))
}
# An output line nests its body two levels down; orjson writes 254 at most. Text with fewer
# brackets than this is surely not too deep to be written so.
_SHALLOW = 250
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error"}  # fmt: skip


@dataclass(slots=True)
class Result:
    custom_id: str
    kind: str  # succeeded | failed | cancelled | expired
    model: str
    text: str = ""
    usage: Usage = field(default_factory=Usage)
    response: dict[str, Any] | None = None  # succeeded: the upstream's whole answer, if it gave one
    # succeeded, instead of `response`: that answer as it was kept (a `_KEPT_HEADS` text), and
    # where its model's value is in it
    kept: tuple[str, int, int] | None = None
    # succeeded: what was asked (the stored payload's text), read only for an answer built here
    payload: str | None = None
    status: int | None = None  # failed: the HTTP status of this request's failure (None: a timeout)
    error_type: str = "server_error"
    error_code: str | None = None
    param: str | None = None  # failed at the edge: the field refused
    message: str = ""


def results(
    store: Store, folder: Path, batch: Row, jobs_list: list[dict[str, Any]], ending: str, endpoint: str | None = None
) -> Iterator[Result]:
    """Every request of the batch, once. `ending` is how the batch ends (completed,
    cancelled, expired): it decides what a request that never ran becomes. Given the
    `endpoint` whose shape the answers are written in, a request's payload is read only for
    an answer that is not already in that shape (the one `answer` builds from the text)."""
    unfinished = "expired" if ending == "expired" else "cancelled"
    for job in jobs_list:
        with store.read() as conn:
            job_id = conn.execute(select(jobs.c.id).where(jobs.c.name == job["name"])).scalar()
        if job_id is None:  # never loaded (cancelled while validating): nothing of it ran
            yield from _not_run(folder / f"{job['name']}.jsonl", job["model"], unfinished)
            continue
        model = job["model"]
        head = _KEPT_HEADS.get(endpoint)  # (None: every kept answer is read)
        last, size = 0, min(FIRST_PAGE, PAGE)
        while True:
            with store.read() as conn:
                page = conn.execute(_page(job_id, last, size, with_payload=endpoint is None)).fetchall()
                found = [_result(r, model, unfinished, head) for r in page]
                if endpoint is not None:
                    _add_payloads(conn, endpoint, page, found)
            held = _held(page, found)
            yield from found
            if len(page) < size:
                break
            last = page[-1][0]
            found = page = None  # let go before the next page is read: never two held at once
            size = next_page_size(held, size)
    rejected = folder / "rejected.jsonl"
    if rejected.exists():
        with rejected.open(encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                yield Result(r["custom_id"], "failed", r["model"], status=r["status"], error_type=r["type"],
                             error_code=r["code"], param=r.get("param"), message=r["message"])  # fmt: skip


_c = requests.c
# The order `_result` unpacks; the payload, when read with the page, comes last.
_COLUMNS = (_c.id, _c.source_key, _c.state, _c.output, _c.response, _c.error_code, _c.error_message,
            _c.input_tokens, _c.cached_input_tokens, _c.cache_write_tokens, _c.output_tokens, _c.reasoning_tokens)  # fmt: skip


def _page(job_id: int, after: int, size: int, with_payload: bool) -> Select:
    columns = (*_COLUMNS, payload_text().label("payload")) if with_payload else _COLUMNS
    return select(*columns).where(_c.job_id == job_id, _c.id > after).order_by(_c.id).limit(size)


def next_page_size(held: int, rows: int) -> int:
    """Rows for the next page, so that it holds about PAGE_BYTES if its rows are like the
    last page's `rows`, which held `held` characters: between 1 and PAGE."""
    return max(1, min(PAGE, PAGE_BYTES * rows // max(held, 1)))


def _held(page: list[Row], found: list[Result]) -> int:
    """What a page held, in characters of the texts it read: outputs, answers, payloads."""
    return sum(len(r[3] or "") + len(r[4] or "") for r in page) + sum(len(r.payload or "") for r in found)


def _add_payloads(conn: Connection, endpoint: str, page: list[Row], found: list[Result]) -> None:
    """The payloads of the page's succeeded requests whose answer `answer` must build."""
    wanted = {row[0]: r for row, r in zip(page, found, strict=True) if r.kind == "succeeded" and r.kept is None and not in_shape(endpoint, r.response)}  # fmt: skip
    if wanted:
        for request_id, payload in conn.execute(select(_c.id, payload_text()).where(among(conn, _c.id, list(wanted)))):
            wanted[request_id].payload = payload


def _not_run(path: Path, model: str, kind: str) -> Iterator[Result]:
    if path.exists():
        with path.open(encoding="utf-8") as f:
            for line in f:
                yield Result(decode_key(json.loads(line)["custom_id"]), kind, model)


def _result(r: Row, model: str, unfinished: str, head: re.Pattern[str] | None = None) -> Result:
    # Unpacked, not read by name: this runs once per request of the batch.
    _, key, state, output, response, error_code, error_message, tin, tcached, twrite, tout, treason, *payload = r
    custom_id = decode_key(key)
    if state == SUCCEEDED:
        usage = Usage(tin or 0, tcached or 0, twrite or 0, tout or 0, treason or 0)
        if head is not None and response is not None and (told := head.match(response)) is not None:
            start, end = told.span(1)
            return Result(custom_id, "succeeded", model, text=output or "", usage=usage, kept=(response, start, end))
        return Result(custom_id, "succeeded", model, text=output or "", usage=usage,
                      response=None if response is None else fastjson.loads(response),
                      payload=payload[0] if payload else None)  # fmt: skip
    if error_code in EXPIRED_CODES:
        return Result(custom_id, "expired", model)
    if state == FAILED:
        message = error_message or "the request failed"
        if error_code in TIMEOUT_CODES:
            return Result(custom_id, "failed", model, status=None, error_code="request_timeout", message=message)
        status, kind, code = HTTP_ERRORS.get(error_code, (500, "server_error", error_code))
        return Result(custom_id, "failed", model, status=status, error_type=kind, error_code=code, message=message)
    return Result(custom_id, unfinished, model)  # cancelled, or never finished


def _ids(batch_id: str, custom_id: str) -> str:
    return hashlib.sha256(f"{batch_id}\x00{custom_id}".encode("utf-8", "surrogatepass")).hexdigest()


def answer(endpoint: str, r: Result, ids: Ids, created: int) -> dict[str, Any]:
    """A succeeded request's answer in `endpoint`'s shape, naming the model it asked for: the
    upstream's whole answer when it is in that shape, else built from the text it kept."""
    if r.kept is not None:
        r.response, r.kept = fastjson.loads(r.kept[0]), None
    if in_shape(endpoint, r.response):  # the usual case: the request's payload is not read
        return r.response | {"model": r.model}
    request = Request.from_payload(r.custom_id, fastjson.loads(r.payload)) if r.payload else None
    finish = finish_of(r.response)  # lowtide's words (routes/replies.py): the kept answer's own
    if finish is None:  # a row stored before answers were kept: all of the limit used reads as cut
        limit = request.output_limit if request else None
        finish = "length" if limit and r.usage.output_tokens >= limit else "stop"
    asked = Request(r.custom_id, endpoint, dict(request.body) if request else {})
    asked.model = r.model
    return text_body(asked, r.text, finish, r.usage, ids=ids, created=created)


def openai_line(batch_id: str, r: Result, created: int, endpoint: str = CHAT) -> tuple[str, bool]:
    """One output or error file line, and whether it belongs in the output file."""
    h = _ids(batch_id, r.custom_id)
    line: dict[str, Any] = {"id": f"batch_req_{h[:32]}", "custom_id": r.custom_id, "response": None, "error": None}
    if r.kind == "succeeded":
        if r.kept is not None and (written := _kept_line(line, h, r)) is not None:
            return written, True
        body = answer(endpoint, r, Ids(h[32:56]), created)
        line["response"] = {"status_code": 200, "request_id": f"req_{h[:32]}", "body": body}
        return _dumps(line), True
    if r.kind == "failed" and r.status is not None:
        error = {"message": r.message, "type": r.error_type, "param": r.param, "code": r.error_code}
        line["response"] = {"status_code": r.status, "request_id": f"req_{h[:32]}", "body": {"error": error}}
    elif r.kind == "failed":
        line["error"] = {"code": "request_timeout", "message": r.message}
    elif r.kind == "expired":
        line["error"] = {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}
    else:
        line["error"] = {"code": "batch_cancelled", "message": "This request was not executed because the batch was cancelled."}
    return _dumps(line), False


def _kept_line(line: dict[str, Any], h: str, r: Result) -> str | None:
    """The output line of a kept answer, its text taken as it is (`_KEPT_HEADS`); None where
    it must be read and written the general way (a line orjson does not write: a lone
    surrogate, a model that is not JSON to it, an answer nested too deep)."""
    text, start, end = r.kept
    if text.count("{") + text.count("[") >= _SHALLOW:
        return None
    try:
        model = orjson.dumps(r.model).decode()
        if text[start:end] != model:
            text = text[:start] + model + text[end:]
        line["response"] = {"status_code": 200, "request_id": f"req_{h[:32]}", "body": orjson.Fragment(text)}
        return orjson.dumps(line).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return None


def anthropic_line(batch_id: str, r: Result) -> str:
    if r.kind == "succeeded":
        message = answer(MESSAGES, r, Ids("01" + _ids(batch_id, r.custom_id)[:22]), 0)
        # This server is the provider here, and it ran the request as a batch.
        message["usage"] = {"service_tier": "batch"} | message.get("usage", {})
        result: dict[str, Any] = {"type": "succeeded", "message": message}
    elif r.kind == "failed":
        kind = "timeout_error" if r.status is None else ANTHROPIC_ERROR_TYPES.get(r.status, "api_error")
        result = {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": r.message}, "request_id": None}}
    elif r.kind == "cancelled":
        result = {"type": "canceled"}
    else:
        result = {"type": "expired"}
    return _dumps({"custom_id": r.custom_id, "result": result})
