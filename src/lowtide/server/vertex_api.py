"""Vertex AI's batch prediction jobs, as google-genai with `vertexai=True` calls them at a
`base_url` (serve's URL), API version v1:

    POST /v1/projects/{p}/locations/{l}/batchPredictionJobs        {"displayName", "model": "publishers/google/models/M",
                                                                    "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris"}},
                                                                    "outputConfig": {"predictionsFormat": "jsonl",
                                                                                     "gcsDestination": {"outputUriPrefix"}}}
    GET  /v1/projects/{p}/locations/{l}/batchPredictionJobs/{id}
    GET  /v1/projects/{p}/locations/{l}/batchPredictionJobs?filter=display_name="…"&pageSize=&pageToken=
    POST /v1/projects/{p}/locations/{l}/batchPredictionJobs/{id}:cancel

The SDK always sends `x-goog-api-client`, so gemini_versions.py moves these calls to
`/v1beta/…` before anything else sees them: the key check (the credentials' bearer token is
the key), Google's error shape and the fault plan (`match: "POST /v1beta/projects/…"`) treat
them as Gemini's.

A job runs as one of serve's Gemini batches (the same worker, backend, clock and fault
plan; Gemini's `/v1beta/batches` lists it too). At create its input is read from Cloud
Storage through the object-store layer (gcsfs: the emulator at STORAGE_EMULATOR_HOST with
FSSPEC_GCS_TOKEN=anon, or Google's own), line by line: each `{"request"}` line becomes a
request (intake.py; one the backend refuses fails alone). Once the batch has ended, the
first read of the job writes `predictions.jsonl` into `{outputUriPrefix}/prediction-model-
{created}/`, one `{"status", "processed_time", "request", "response"}` line per request that
ran (`status` "" or `Bad Request: {"error": {...}}`; the request as it came: Vertex's lines
carry no key, a client matches by what its requests carry), with the plan's line faults, and
only then reports the job ended, naming that folder in `outputInfo.gcsOutputDirectory`.
Requests that never ran (cancelled, expired) get no line. A job that ended with some
requests failed is JOB_STATE_PARTIALLY_SUCCEEDED.
"""

from __future__ import annotations

import hashlib
import http
import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import Row
from starlette.concurrency import run_in_threadpool

from lowtide.core import fastjson
from lowtide.core.endpoints import GEMINI
from lowtide.core.errors import SourceError
from lowtide.core.locations import location, scheme_of, store_problem
from lowtide.routes.replies import Ids, in_shape
from lowtide.server import records, safejson
from lowtide.server.bodies import parse_object, read_body
from lowtide.server.context import Server
from lowtide.server.errors import ApiError
from lowtide.server.faults import line_fates
from lowtide.server.finalize import Summary, batch_folder, live_summary
from lowtide.server.gemini_files import rfc3339
from lowtide.server.gemini_outputs import error_of, meta_of
from lowtide.server.intake import Intake
from lowtide.server.outputs import answer, results
from lowtide.server.records import TERMINAL
from lowtide.server.records import BatchStatus as S
from lowtide.server.translate import decode_key, rejection

MARK = "vertex"  # the batch metadata key a Vertex job's own fields ride under
JOBS = "/projects/{project}/locations/{location}/batchPredictionJobs"
GOOGLE = "publishers/google/models/"
REFUSED = "vertex_refused.jsonl"  # the requests the backend refused at create, kept for their lines
STATES = {S.VALIDATING: "JOB_STATE_PENDING", S.IN_PROGRESS: "JOB_STATE_RUNNING", S.FINALIZING: "JOB_STATE_RUNNING",
          S.CANCELLING: "JOB_STATE_CANCELLING", S.COMPLETED: "JOB_STATE_SUCCEEDED", S.FAILED: "JOB_STATE_FAILED",
          S.EXPIRED: "JOB_STATE_EXPIRED", S.CANCELLED: "JOB_STATE_CANCELLED"}  # fmt: skip
_FILTER = re.compile(r'^\s*display_name\s*=\s*"((?:[^"\\]|\\.)*)"\s*$')

router = APIRouter(prefix="/v1beta" + JOBS)  # where gemini_versions.py moves Vertex's /v1 calls


def _server(request: Request) -> Server:
    return request.app.state.server


def own_of(row: Row) -> dict[str, Any] | None:
    return meta_of(row).get(MARK)


def _get(server: Server, project: str, location_: str, job_id: str) -> Row:
    with server.store.read() as conn:
        row = records.get_batch(conn, job_id, "gemini")
    own = own_of(row) if row is not None else None
    if own is None or (own["project"], own["location"]) != (project, location_):
        raise ApiError(404, f"The BatchPredictionJob does not exist: projects/{project}/locations/{location_}/batchPredictionJobs/{job_id}")
    return row


# Create -----------------------------------------------------------------------------------
@router.post("")
async def create(project: str, location: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    raw = await read_body(request, server.config.max_request_bytes, server.config.body_timeout)
    body = parse_object(raw, server.config.max_json_depth)
    model, uris, prefix = _checked(body)
    job_id = str(10**18 + secrets.randbelow(9 * 10**18))  # Vertex's job ids are numbers
    intake = await run_in_threadpool(_take, server, job_id, model, uris)
    own = {"project": project, "location": location, "uris": uris, "prefix": prefix, "output": None}
    meta = {"displayName": body.get("displayName"), "inline": False, MARK: own}
    row = await run_in_threadpool(_store, server, job_id, model, meta, intake)
    server.notify()
    return job_object(server, row)


def _checked(body: dict[str, Any]) -> tuple[str, list[str], str]:
    """The model, the input URIs and the output prefix of a create, or the 400 naming the field."""
    model = body.get("model")
    if not isinstance(model, str) or not model.removeprefix(GOOGLE) or "\x00" in model:
        raise ApiError(400, "model: give the publisher model, such as publishers/google/models/gemini-2.5-flash.")
    name = model.removeprefix(GOOGLE)
    if "/" in name:
        raise ApiError(400, f"model: {model} is not served here; this server runs publishers/google models.")
    source = body.get("inputConfig") if isinstance(body.get("inputConfig"), dict) else {}
    uris = (source.get("gcsSource") or {}).get("uris") if isinstance(source.get("gcsSource"), dict) else None
    if source.get("instancesFormat") != "jsonl" or not isinstance(uris, list) or not uris:
        raise ApiError(400, 'inputConfig: give instancesFormat "jsonl" and gcsSource.uris (gs:// JSONL files); BigQuery is not served here.')
    output = body.get("outputConfig") if isinstance(body.get("outputConfig"), dict) else {}
    prefix = (output.get("gcsDestination") or {}).get("outputUriPrefix") if isinstance(output.get("gcsDestination"), dict) else None
    if output.get("predictionsFormat") != "jsonl" or not isinstance(prefix, str):
        raise ApiError(400, 'outputConfig: give predictionsFormat "jsonl" and gcsDestination.outputUriPrefix (a gs:// prefix).')
    for uri in [*uris, prefix]:
        if not isinstance(uri, str) or scheme_of(uri) != "gs":
            raise ApiError(400, f"{uri!r} is not a gs:// URI; inputs and outputs are in Cloud Storage.")
    return name, uris, prefix.rstrip("/")


def _lines(server: Server, uris: list[str]) -> Iterator[tuple[str, Any]]:
    """(where, request) of each input line, streamed from Cloud Storage."""
    for uri in uris:
        try:
            loc = location(uri)
            with loc.open_text(loc.path) as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        data = safejson.loads(line.encode(), server.config.max_json_depth)
                    except ValueError as err:
                        raise ApiError(400, f"{uri} line {n}: not valid JSON ({err}).") from None
                    if not isinstance(data, dict) or not isinstance(data.get("request"), dict):
                        raise ApiError(400, f'{uri} line {n}: expected {{"request": {{GenerateContentRequest}}}}.')
                    yield f"{uri} line {n}", data["request"]
        except SourceError as err:
            raise ApiError(400, f"inputConfig.gcsSource.uris: {err}") from None


def _take(server: Server, job_id: str, model: str, uris: list[str]) -> Intake:
    with Intake(batch_folder(server, job_id), job_id) as intake:
        try:
            with (intake.folder / REFUSED).open("w", encoding="utf-8") as refused_file:
                for n, (_where, asked) in enumerate(_lines(server, uris)):
                    # Vertex's lines have no key of their own: the line's place is one. Its labels
                    # are Vertex's metadata for the request, never the model's to see: they ride
                    # in the key, and come back on its predictions line (`_Requests`).
                    labels = asked.get("labels")
                    key = fastjson.dumps([n, labels])
                    run = {k: v for k, v in asked.items() if k != "labels"}
                    refused = rejection(server.route, GEMINI, run | {"model": model}, server.config.model, "gemini")
                    if refused is not None:
                        refused_file.write(fastjson.dumps({"key": key, "request": asked}) + "\n")
                    intake.add(key, model, refused or {"body": run})
        except BaseException:
            intake.discard()
            raise
    if intake.total == 0:
        intake.discard()
        raise ApiError(400, "inputConfig.gcsSource.uris: the input holds no request lines.")
    return intake


def _store(server: Server, job_id: str, model: str, meta: dict[str, Any], intake: Intake) -> Row:
    now = server.clock.now()
    jobs = [{"name": j["name"], "model": j["model"]} for j in intake.jobs.values()]
    with server.store.begin() as conn:
        records.insert_batch(
            conn, id=job_id, api="gemini", endpoint=GEMINI, model=model, metadata=meta, jobs=jobs,
            faults=server.faults.for_batch("gemini"), total=intake.total, rejected=intake.rejected, created_at=now,
            expires_at=now + 3 * server.config.completion_window,  # Vertex: 72 h at the default window (unconfirmed)
        )  # fmt: skip
        return records.get_batch(conn, job_id)


# Reading ----------------------------------------------------------------------------------
def job_object(server: Server, row: Row) -> dict[str, Any]:
    """The batch as Vertex's BatchPredictionJob."""
    own = own_of(row)
    ended = row.status in TERMINAL
    if ended and row.counts is not None:
        counts = Summary.from_json(row.counts).counts
    else:
        with server.store.read() as conn:
            counts = live_summary(conn, row).counts
    state = STATES[S(row.status)]
    if state == "JOB_STATE_SUCCEEDED" and counts["failed"]:
        state = "JOB_STATE_PARTIALLY_SUCCEEDED"
    stamps = [t for t in (row.created_at, row.in_progress_at, row.finalizing_at, row.cancelling_at, row.completed_at,
                          row.failed_at, row.expired_at, row.cancelled_at) if t is not None]  # fmt: skip
    done = counts["succeeded"] + counts["failed"]
    job: dict[str, Any] = {
        "name": f"projects/{own['project']}/locations/{own['location']}/batchPredictionJobs/{row.id}",
        "displayName": meta_of(row).get("displayName"), "model": f"{GOOGLE}{row.model}",
        "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": own["uris"]}},
        "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": own["prefix"]}},
        "state": state, "createTime": rfc3339(row.created_at), "updateTime": rfc3339(max(stamps)),
        "completionStats": {"successfulCount": str(counts["succeeded"]), "failedCount": str(counts["failed"]),
                            "incompleteCount": str(max(row.total - done, 0))},
    }  # fmt: skip
    if row.in_progress_at is not None:
        job["startTime"] = rfc3339(row.in_progress_at)
    if ended:
        job["endTime"] = rfc3339(max(stamps))
    if own.get("output"):
        job["outputInfo"] = {"gcsOutputDirectory": own["output"]}
    if row.status == S.FAILED:
        errors = json.loads(row.errors)["data"] if row.errors else []
        job["error"] = {"code": 3, "message": "; ".join(e["message"] for e in errors) or "the job failed"}  # INVALID_ARGUMENT
    return job


def _read(server: Server, project: str, location_: str, job_id: str) -> dict[str, Any]:
    """The job; an ended one has its predictions written first (once), so a job never reads
    as ended before its output is there."""
    row = _get(server, project, location_, job_id)
    if row.status in TERMINAL and row.status != S.FAILED and not own_of(row).get("output"):
        folder = _export(server, row)
        meta = meta_of(row)
        meta[MARK]["output"] = folder
        with server.store.begin() as conn:
            records.set_batch(conn, row.id, metadata=json.dumps(meta))
        row = _get(server, project, location_, job_id)
    return job_object(server, row)


@router.get("/{job_id}")
def get(project: str, location: str, job_id: str, request: Request) -> dict[str, Any]:
    return _read(_server(request), project, location, job_id)


@router.get("")
def list_(project: str, location: str, request: Request, pageSize: int = 100, pageToken: str | None = None,  # noqa: N803 (Vertex's names)
          filter: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Newest first. The one filter served is `display_name="…"` (how a client finds its job again)."""
    server = _server(request)
    if not 1 <= pageSize <= 1000:
        raise ApiError(400, f"pageSize must be between 1 and 1000; got {pageSize}.")
    wanted = None
    if filter:
        m = _FILTER.match(filter)
        if m is None:
            raise ApiError(400, f'filter {filter!r} is not served here; the one filter served is display_name="NAME".')
        wanted = json.loads(f'"{m.group(1)}"')
    start = int(pageToken) if pageToken and pageToken.isdigit() else 0
    with server.store.read() as conn:
        rows = records.list_batches(conn, "gemini", 1_000_000)[0]
    mine = [r for r in rows if (own := own_of(r)) is not None and (own["project"], own["location"]) == (project, location)
            and (wanted is None or meta_of(r).get("displayName") == wanted)]  # fmt: skip
    page = mine[start : start + pageSize]
    out: dict[str, Any] = {"batchPredictionJobs": [_read(server, project, location, r.id) for r in page]}
    if start + pageSize < len(mine):
        out["nextPageToken"] = str(start + pageSize)
    return out


@router.post("/{job_id}:cancel")
def cancel(project: str, location: str, job_id: str, request: Request) -> dict[str, Any]:
    server = _server(request)
    row = _get(server, project, location, job_id)
    status = records.begin_cancel(server, row.id, lambda: S(_get(server, project, location, job_id).status))
    if status in TERMINAL:
        raise ApiError(400, f"The BatchPredictionJob {job_id} has already ended ({STATES[status]}); it cannot be cancelled.")
    return {}


# Predictions ------------------------------------------------------------------------------
def _export(server: Server, row: Row) -> str:
    """Write the job's predictions.jsonl under its output prefix; its folder's URL."""
    own = own_of(row)
    folder = f"{own['prefix']}/prediction-model-{rfc3339(row.created_at)}"
    try:
        target = location(f"{folder}/predictions.jsonl")
    except SourceError as err:
        raise ApiError(500, f"writing the predictions: {err}") from None
    ending = {S.EXPIRED: "expired", S.CANCELLED: "cancelled"}.get(S(row.status), "completed")
    created = int(server.clock.now())
    stamp = rfc3339(server.clock.now())
    requests = _Requests(server, row)

    def lines():
        for r in results(server.store, batch_folder(server, row.id), row, records.jobs_of(row), ending):
            if r.kind not in ("succeeded", "failed"):
                continue  # never ran: Vertex writes no line for it
            line: dict[str, Any] = {"status": "", "processed_time": stamp, "request": requests.of(r)}
            if r.kind == "succeeded":
                h = hashlib.sha256(f"{row.id}\x00{r.custom_id}".encode("utf-8", "surrogatepass")).hexdigest()
                line["response"] = r.response if in_shape(GEMINI, r.response) else answer(GEMINI, r, Ids(h[:24]), created)
            else:
                line["status"] = status_text(error_of(r))
            yield fastjson.dumps(line), r

    try:
        with target.fs.open(target.path, "wb") as out:
            for line, _r, _fate in line_fates(lines(), records.faults_of(row)):
                out.write((line + "\n").encode("utf-8", "backslashreplace"))
    except OSError as err:
        raise ApiError(500, f"writing the predictions: {store_problem(target.text, err, 'write')}") from None
    return folder


def status_text(error: dict[str, Any]) -> str:
    """A failed line's `status`, as Vertex writes one: `Bad Request: {"error": {...}}`."""
    try:
        phrase = http.HTTPStatus(error["code"]).phrase
    except ValueError:
        phrase = "Error"
    return f"{phrase}: {json.dumps({'error': error})}"


class _Requests:
    """A result's request as it came: the stored payload's body (without the model, the
    job's), or, for a request refused at create or never loaded, its input line."""

    def __init__(self, server: Server, row: Row):
        self.folder = batch_folder(server, row.id)
        self.jobs = records.jobs_of(row)
        self._others: dict[str, Any] | None = None

    def of(self, r: Any) -> Any:
        if r.payload:
            body = fastjson.loads(r.payload).get("body") or {}
            request = {k: v for k, v in body.items() if k != "model"}
            labels = fastjson.loads(r.custom_id)[1]
            return request if labels is None else request | {"labels": labels}
        if self._others is None:  # the few without a payload: read once, when one comes
            self._others = {}
            refused = self.folder / REFUSED
            if refused.exists():
                for text in refused.read_text(encoding="utf-8").splitlines():
                    item = json.loads(text)
                    self._others[item["key"]] = item["request"]
            for job in self.jobs:
                source = self.folder / f"{job['name']}.jsonl"
                if source.exists():
                    for text in source.read_text(encoding="utf-8").splitlines():
                        item = json.loads(text)
                        key = decode_key(item["custom_id"])
                        labels = fastjson.loads(key)[1]
                        body = {k: v for k, v in (item.get("body") or {}).items() if k != "model"}
                        self._others.setdefault(key, body if labels is None else body | {"labels": labels})
        return self._others.get(r.custom_id)
