"""Ending a batch: write its output (OpenAI: output and error files; Anthropic: results),
with any line faults of the plan, and sum up its counts and usage. Also the live counts
of a batch still running."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Row, func, select

from lowtide.core.endpoints import MESSAGES
from lowtide.core.states import RequestState
from lowtide.server import records
from lowtide.server.billing import Bill
from lowtide.server.context import Server
from lowtide.server.faults import line_fates
from lowtide.server.outputs import anthropic_line, openai_line, results
from lowtide.store.schema import jobs, requests

OUTPUT_FILE_DAYS = 30
WRITE_BUFFER = 1 << 20  # an output file is written in few large writes
# A lone surrogate (in a custom_id taken before the intake refused them) can only sit in a
# JSON string, where "\ud800" is its own escape: written so, a line stays valid UTF-8 JSON.
LONE_SURROGATES = "backslashreplace"


@dataclass(slots=True)
class Summary:
    """Requests by outcome and the tokens of those that succeeded."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("succeeded", "failed", "cancelled", "expired"), 0))
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens"), 0))

    def to_json(self) -> str:
        return json.dumps({"counts": self.counts, "usage": self.usage})

    @classmethod
    def from_json(cls, raw: str) -> Summary:
        data = json.loads(raw)
        return cls(data["counts"], data["usage"])


def batch_folder(server: Server, batch_id: str):
    return server.path(f"batches/{batch_id}")


def build_openai(server: Server, row: Row, ending: str) -> dict[str, Any]:
    """Write the output and error files; return the column values for the batch row, the
    file rows to insert (an empty file gets no id) and the bill's lines (billing.py)."""
    summary = Summary()
    bill = Bill(row.id, "openai", server.clock.now())
    files_dir = server.path("files")
    files_dir.mkdir(parents=True, exist_ok=True)
    paths = {True: f"files/{row.id}_output.jsonl", False: f"files/{row.id}_error.jsonl"}
    created = int(server.clock.now())
    found = results(server.store, batch_folder(server, row.id), row, records.jobs_of(row), ending, row.endpoint)

    def lines():
        for r in found:
            _count(summary, r)
            line, is_output = openai_line(row.id, r, created, row.endpoint)
            yield line, (is_output, r)

    sizes = {True: 0, False: 0}
    with open(server.path(paths[True]), "wb", buffering=WRITE_BUFFER) as out, open(server.path(paths[False]), "wb") as err:
        for line, (is_output, r), fate in line_fates(lines(), records.faults_of(row)):
            bill.note(r, fate)
            data = (line + "\n").encode("utf-8", LONE_SURROGATES)
            (out if is_output else err).write(data)
            sizes[is_output] += len(data)
    now = server.clock.now()
    keep = row.output_expires_after or OUTPUT_FILE_DAYS * 86400  # the batch's output_expires_after
    values: dict[str, Any] = {"counts": summary.to_json(), "output_file_id": None, "error_file_id": None}
    new_files = []
    for is_output, column in ((True, "output_file_id"), (False, "error_file_id")):
        if sizes[is_output] == 0:
            server.path(paths[is_output]).unlink(missing_ok=True)
            continue
        file_id = records.new_id("file-")
        values[column] = file_id
        new_files.append({"id": file_id, "purpose": "batch_output", "filename": paths[is_output].removeprefix("files/"),
                          "bytes": sizes[is_output], "path": paths[is_output], "created_at": now,
                          "expires_at": now + keep})  # fmt: skip
    return {"values": values, "files": new_files, "bill": bill.rows()}


def build_anthropic(server: Server, row: Row, ending: str) -> dict[str, Any]:
    summary = Summary()
    bill = Bill(row.id, "anthropic", server.clock.now())
    folder = batch_folder(server, row.id)
    folder.mkdir(parents=True, exist_ok=True)
    found = results(server.store, folder, row, records.jobs_of(row), ending, MESSAGES)

    def lines():
        for r in found:
            _count(summary, r)
            yield anthropic_line(row.id, r), r

    with (folder / "results.jsonl").open("w", encoding="utf-8", errors=LONE_SURROGATES) as f:
        for line, r, fate in line_fates(lines(), records.faults_of(row)):
            bill.note(r, fate)
            f.write(line + "\n")
    return {"values": {"counts": summary.to_json()}, "files": [], "bill": bill.rows()}


def _count(summary: Summary, r) -> None:
    summary.counts[r.kind] += 1
    if r.kind == "succeeded":
        for key in summary.usage:
            summary.usage[key] += getattr(r.usage, key)


def live_summary(conn: Connection, row: Row) -> Summary:
    """Counts and usage of a batch still running, from its jobs' requests."""
    summary = Summary()
    summary.counts["failed"] = row.rejected
    names = [j["name"] for j in records.jobs_of(row)]
    if not names:
        return summary
    job_ids = select(jobs.c.id).where(jobs.c.name.in_(names))
    by_state = conn.execute(
        select(requests.c.state, func.count(), func.coalesce(func.sum(requests.c.input_tokens), 0),
               func.coalesce(func.sum(requests.c.cached_input_tokens), 0), func.coalesce(func.sum(requests.c.output_tokens), 0),
               func.coalesce(func.sum(requests.c.reasoning_tokens), 0))  # fmt: skip
        .where(requests.c.job_id.in_(job_ids))
        .group_by(requests.c.state)
    )
    for state, n, tin, tcached, tout, treason in by_state:
        if state == RequestState.SUCCEEDED:
            summary.counts["succeeded"] += n
            summary.usage.update(input_tokens=tin, cached_input_tokens=tcached, output_tokens=tout, reasoning_tokens=treason)
        elif state == RequestState.FAILED:
            summary.counts["failed"] += n
    return summary
