"""Ending a Gemini batch: its responses in Gemini's shapes, one per request, matched by key.

An inline batch keeps them in its folder (`inline.jsonl`, one `{"response" | "error",
"metadata": {"key"}}` per line), and the batch object carries them as
`output.inlinedResponses`; a file batch gets a responses file (`{"key", "response"}` or
`{"key", "error"}` lines) that `files/{name}:download` serves. The fault plan's line faults
apply to both.
"""

from __future__ import annotations

import json
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
        for r in found:
            _count(summary, r)
            said = outcome_of(r, row.id, created)
            line = said | {"metadata": {"key": r.custom_id}} if inline else {"key": r.custom_id} | said
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
