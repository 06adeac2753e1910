"""Ending a Gemini batch: its responses in Gemini's shapes, one per request, matched by key.

An inline batch keeps them in its folder (`inline.jsonl`, one `{"response" | "error",
"metadata"}` per line), and the batch object carries them as `output.inlinedResponses`: in
the requests' order, each with its request's own `metadata` (none where it had none), as
Gemini answers (the order and metadata its intake kept, gemini_intake.py); a file batch gets a responses file (`{"key", "response"}` or
`{"key", "error"}` lines) that `files/{name}:download` serves. The fault plan's line faults
apply to both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Row

from lowtide.core import fastjson
from lowtide.core.endpoints import GEMINI
from lowtide.routes.replies import Ids, in_shape
from lowtide.server import records
from lowtide.server.billing import Bill
from lowtide.server.context import Server
from lowtide.server.errors import GEMINI_STATUS
from lowtide.server.faults import line_fates
from lowtide.server.finalize import LONE_SURROGATES, OUTPUT_FILE_DAYS, Summary, _count, batch_folder
from lowtide.server.gemini_intake import ORDER
from lowtide.server.outputs import Result, _ids, answer, results

INLINE = "inline.jsonl"


def meta_of(row: Row) -> dict[str, Any]:
    return json.loads(row.metadata) if row.metadata else {}


def response_of(r: Result, batch_id: str, created: int) -> dict[str, Any]:
    """A succeeded request's GenerateContentResponse: the backend's own when it gave one in
    Gemini's shape, else built from the text it kept."""
    if in_shape(GEMINI, r.response):
        return r.response
    return answer(GEMINI, r, Ids(_ids(batch_id, r.custom_id)[:24]), created)


def error_of(r: Result) -> dict[str, Any]:
    if r.kind == "cancelled":
        return {"code": 499, "message": "This request was not run: the batch was cancelled.", "status": "CANCELLED"}
    if r.kind == "expired":
        return {"code": 504, "message": "This request was not run before the batch expired.", "status": "DEADLINE_EXCEEDED"}
    status = r.status or 504
    return {"code": status, "message": r.message, "status": GEMINI_STATUS.get(status, "INTERNAL")}


def outcome_of(r: Result, batch_id: str, created: int) -> dict[str, Any]:
    if r.kind == "succeeded":
        return {"response": response_of(r, batch_id, created)}
    return {"error": error_of(r)}


def in_order(folder: Path, found: Iterable[Result]) -> Iterator[tuple[Result, Any]]:
    """An inline batch's results in its requests' order, each with its request's metadata.
    A batch taken in before that order was kept: as found, each metadata `{"key"}`."""
    order = folder / ORDER
    if not order.exists():
        yield from ((r, {"key": r.custom_id}) for r in found)
        return
    by_key = {r.custom_id: r for r in found}  # an inline batch: under 20 MB of requests
    with order.open(encoding="utf-8", errors="surrogatepass") as f:
        for line in f:
            key, meta = fastjson.loads(line)
            if (r := by_key.pop(key, None)) is not None:  # (each request has its result: jobs' rows, rejected)
                yield r, meta


def build_gemini(server: Server, row: Row, ending: str) -> dict[str, Any]:
    summary = Summary()
    bill = Bill(row.id, "gemini", server.clock.now())
    folder = batch_folder(server, row.id)
    folder.mkdir(parents=True, exist_ok=True)
    inline = bool(meta_of(row).get("inline"))
    created = int(server.clock.now())
    # GEMINI: a page's payloads are read only for answers built here, not with every row
    found = results(server.store, folder, row, records.jobs_of(row), ending, GEMINI)

    def lines():
        for r, meta in in_order(folder, found) if inline else ((r, None) for r in found):
            _count(summary, r)
            said = outcome_of(r, row.id, created)
            line = said | ({} if meta is None else {"metadata": meta}) if inline else {"key": r.custom_id} | said
            yield fastjson.dumps(line), r

    path = folder / INLINE if inline else server.path(f"files/{row.id}_responses.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    with path.open("w", encoding="utf-8", errors=LONE_SURROGATES) as f:
        for line, r, fate in line_fates(lines(), records.faults_of(row)):
            bill.note(r, fate)
            size += f.write(line + "\n")
    values: dict[str, Any] = {"counts": summary.to_json()}
    if inline:
        return {"values": values, "files": [], "bill": bill.rows()}
    now = server.clock.now()
    file_id = f"batch-{row.id}"
    values["output_file_id"] = file_id
    file = {"id": file_id, "purpose": "gemini_output", "filename": path.name, "bytes": size,
            "path": f"files/{path.name}", "created_at": now, "expires_at": now + OUTPUT_FILE_DAYS * 86400}  # fmt: skip
    return {"values": values, "files": [file], "bill": bill.rows()}
