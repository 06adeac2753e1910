"""AWS Bedrock's batch inference control plane: boto3's `bedrock` client pointed at
`endpoint_url="http://HOST:PORT"` creates, gets, lists and stops model invocation jobs as it
does at bedrock.REGION.amazonaws.com (`POST /model-invocation-job`, `GET
/model-invocation-job/{jobIdentifier}`, `GET /model-invocation-jobs`, `POST
/model-invocation-job/{jobIdentifier}/stop`; botocore's bedrock service-2.json), with JSON
errors as rest-json reads them (`x-amzn-ErrorType`, `{"message"}`).

boto3 signs each call (SigV4, or a bearer token for Bedrock API keys); serve takes any
signature, reads only the region from the credential scope (for the job's ARN) and never
logs or keeps the header. Input and output live in S3 (bedrock_records.py).

A job runs as one of serve's Anthropic message batches (api "bedrock": the same worker,
backend and fault plan; `batches` rules apply as to api anthropic), its own fields in the
batch's metadata under MARK. The create reads the input at once (an unreadable input or a
bad record is a ValidationException, or the job Failed as Bedrock's validation fails it; under
the card's minimum of records too). `clientRequestToken` is kept: a create with a token
already seen answers that job's ARN and makes nothing (Bedrock's idempotency). Once the
batch has ended, the first look at the job (get or list) writes its .out files and manifest
before it answers, so a client never sees Completed without its output.

States: validating → Validating, in_progress/finalizing → InProgress, completed → Completed
(PartiallyCompleted when a record errored), failed → Failed, expired → Expired, cancelling →
Stopping, cancelled → Stopped.
"""

from __future__ import annotations

import json
import re
import secrets
import string
import threading
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import Row
from starlette.concurrency import run_in_threadpool

from lowtide.core.cards import CARDS
from lowtide.core.endpoints import MESSAGES
from lowtide.core.errors import SourceError
from lowtide.server import bedrock_records as s3
from lowtide.server import records
from lowtide.server.bodies import read_body
from lowtide.server.context import Server
from lowtide.server.finalize import Summary, batch_folder, live_summary
from lowtide.server.intake import Intake
from lowtide.server.records import TERMINAL
from lowtide.server.records import BatchStatus as S

API = "bedrock"  # serve_batches.api of these jobs
MARK = "lowtide_serve_bedrock"  # the metadata key a job's own fields ride under
ACCOUNT = "123456789012"  # the account in every job ARN
MIN_RECORDS = CARDS["bedrock-batch"].limits.min_requests or 1
NAME = re.compile(r"[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}")
TOKEN = re.compile(r"[a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}")
ROLE = re.compile(r"arn:aws(-[^:]+)?:iam::([0-9]{12})?:role/.+")
S3_URI = re.compile(r"s3://[a-z0-9][-.a-z0-9]{1,61}[a-z0-9](?:/[-!_*'().a-z0-9A-Z]+(?:/[-!_*'().a-z0-9A-Z]+)*)?/?")
SCOPE = re.compile(r"Credential=[^/,\s]+/\d{8}/([a-z0-9-]+)/")  # SigV4: KEY/DATE/REGION/SERVICE/aws4_request
STATUS = {S.VALIDATING: "Validating", S.IN_PROGRESS: "InProgress", S.FINALIZING: "InProgress", S.COMPLETED: "Completed",
          S.FAILED: "Failed", S.EXPIRED: "Expired", S.CANCELLING: "Stopping", S.CANCELLED: "Stopped"}  # fmt: skip
WRITTEN = frozenset({S.COMPLETED, S.EXPIRED, S.CANCELLED})  # ended with output to write
_creating = threading.Lock()  # a token is looked up and its job inserted together
_writing = threading.Lock()  # one writer of a job's output

router = APIRouter()


class BedrockError(Exception):
    """An error answer in rest-json's shape."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def response(self) -> JSONResponse:
        return JSONResponse({"message": self.message}, self.status, headers={"x-amzn-ErrorType": self.code})


def invalid(message: str) -> BedrockError:
    return BedrockError(400, "ValidationException", message)


def _server(request: Request) -> Server:
    return request.app.state.server


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _own(row: Row) -> dict[str, Any]:
    return json.loads(json.loads(row.metadata)[MARK])


async def _answer(work, *args) -> Any:
    try:
        return await run_in_threadpool(work, *args)
    except BedrockError as err:
        return err.response()


# Create ---------------------------------------------------------------------------------
@router.post("/model-invocation-job")
async def create(request: Request) -> Any:
    server = _server(request)
    raw = await read_body(request, server.config.max_request_bytes, server.config.body_timeout)
    try:
        body = json.loads(raw)
    except ValueError:
        return invalid("The request body is not valid JSON.").response()
    if not isinstance(body, dict):
        return invalid("The request body must be a JSON object.").response()
    scope = SCOPE.search(request.headers.get("authorization", ""))
    return await _answer(_create, server, body, scope.group(1) if scope else "us-east-1")


def _field(body: dict[str, Any], *path: str) -> Any:
    value: Any = body
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _check(body: dict[str, Any]) -> dict[str, Any]:
    """The create's fields, as botocore's service model and Bedrock check them."""
    fields = {"jobName": (NAME, _field(body, "jobName")), "roleArn": (ROLE, _field(body, "roleArn")),
              "inputDataConfig.s3InputDataConfig.s3Uri": (S3_URI, _field(body, "inputDataConfig", "s3InputDataConfig", "s3Uri")),
              "outputDataConfig.s3OutputDataConfig.s3Uri": (S3_URI, _field(body, "outputDataConfig", "s3OutputDataConfig", "s3Uri"))}  # fmt: skip
    for name, (pattern, value) in fields.items():
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise invalid(f"1 validation error detected: Value {value!r} at '{name}' failed to satisfy constraint: "
                          f"Member must satisfy regular expression pattern: {pattern.pattern}")  # fmt: skip
    token = body.get("clientRequestToken")
    if token is not None and not (isinstance(token, str) and TOKEN.fullmatch(token)):
        raise invalid(f"Value {token!r} at 'clientRequestToken' failed to satisfy constraint: {TOKEN.pattern}")
    model = body.get("modelId")
    if not isinstance(model, str) or not model:
        raise invalid("modelId is required.")
    hours = body.get("timeoutDurationInHours", 24)
    if not isinstance(hours, int) or isinstance(hours, bool) or not 24 <= hours <= 168:
        raise invalid(f"timeoutDurationInHours must be between 24 and 168, not {hours!r}.")
    if body.get("modelInvocationType", "InvokeModel") != "InvokeModel":
        raise invalid("This server runs InvokeModel batch jobs only (Claude Messages bodies), not Converse ones.")
    return {"jobName": body["jobName"], "roleArn": body["roleArn"], "modelId": model, "clientRequestToken": token,
            "input": fields["inputDataConfig.s3InputDataConfig.s3Uri"][1],
            "output": fields["outputDataConfig.s3OutputDataConfig.s3Uri"][1], "hours": hours}  # fmt: skip


def _create(server: Server, body: dict[str, Any], region: str) -> dict[str, Any]:
    own = _check(body)
    with _creating:
        if own["clientRequestToken"] is not None:
            for row in _rows(server):
                if _own(row)["clientRequestToken"] == own["clientRequestToken"]:
                    return {"jobArn": _own(row)["jobArn"]}  # the same create again: its job, nothing new
        job_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(12))
        own |= {"jobArn": f"arn:aws:bedrock:{region}:{ACCOUNT}:model-invocation-job/{job_id}", "written": False}
        _insert(server, job_id, own)
    server.notify()
    return {"jobArn": own["jobArn"]}


def _insert(server: Server, job_id: str, own: dict[str, Any]) -> None:
    """Read the input into the batch's folder and store the batch: running, or Failed as
    Bedrock's validation fails a job (a bad record, fewer records than the minimum)."""
    try:
        own["inputs"] = s3.input_files(own["input"])
    except s3.InputProblem as err:
        raise invalid(f"Unable to read the input at {own['input']}: {err}") from None
    problem = None
    with Intake(batch_folder(server, job_id), job_id) as intake:
        try:
            for uri in own["inputs"]:
                s3.take(intake, uri, own["modelId"], server.refuse(MESSAGES, "anthropic"))
        except s3.InputProblem as err:
            problem = str(err)
    if problem is None and intake.total < MIN_RECORDS:
        problem = (f"The job has {intake.total} records; a batch inference job for {own['modelId']} needs at least "
                   f"{MIN_RECORDS} (the quota 'Minimum number of records per batch inference job').")  # fmt: skip
    if problem is not None:
        intake.discard()
    now = server.clock.now()
    jobs = [] if problem else [{"name": j["name"], "model": j["model"]} for j in intake.jobs.values()]
    with server.store.begin() as conn:
        records.insert_batch(
            conn, id=job_id, api=API, endpoint=MESSAGES, model=own["modelId"], completion_window=f"{own['hours']}h",
            metadata={MARK: json.dumps(own)}, jobs=jobs, faults=server.faults.for_batch("anthropic"), total=intake.total,
            rejected=intake.rejected, created_at=now, expires_at=now + own["hours"] * 3600,
        )  # fmt: skip
        if problem is not None:  # together with the insert: the worker never sees it validating
            records.move_batch(conn, job_id, S.VALIDATING, S.FAILED, now, errors=json.dumps({"data": [{"message": problem}]}))


# Get, list, stop ------------------------------------------------------------------------
def _rows(server: Server) -> list[Row]:
    with server.store.read() as conn:
        return records.list_batches(conn, API, 1_000_000)[0]  # newest first


def _row(server: Server, identifier: str) -> Row:
    job_id = identifier.rsplit("/", 1)[-1]
    with server.store.read() as conn:
        row = records.get_batch(conn, job_id, API)
    if row is None or ("/" in identifier and _own(row)["jobArn"] != identifier):
        raise BedrockError(404, "ResourceNotFoundException", f"The batch inference job {identifier} was not found.")
    return row


def _settled(server: Server, row: Row) -> Row:
    """The job, its output written first if its batch has ended since it was last seen."""
    if S(row.status) not in WRITTEN or _own(row)["written"]:
        return row
    with _writing:
        row = _row(server, row.id)
        own = _own(row)
        if not own["written"]:
            found = s3.read_results(batch_folder(server, row.id) / "results.jsonl")
            try:
                own["manifest"] = s3.write_outputs(own["inputs"], own["output"], row.id, found)
            except (OSError, s3.InputProblem, SourceError) as err:  # asked again, it is tried again
                raise BedrockError(500, "InternalServerException", f"Could not write the job's output to {own['output']}: {err}") from None
            own["written"] = True
            with server.store.begin() as conn:
                records.set_batch(conn, row.id, metadata=json.dumps({MARK: json.dumps(own)}))
    return _row(server, row.id)


def job_object(server: Server, row: Row) -> dict[str, Any]:
    own = _own(row)
    status = S(row.status)
    if row.counts is not None:
        counts = Summary.from_json(row.counts).counts
    else:
        with server.store.read() as conn:
            counts = live_summary(conn, row).counts
    said = STATUS[status]
    if status is S.COMPLETED and counts["failed"]:
        said = "PartiallyCompleted"
    ended = row.completed_at or row.failed_at or row.expired_at or row.cancelled_at
    stamps = [t for t in (row.created_at, row.in_progress_at, row.finalizing_at, row.cancelling_at, ended) if t is not None]
    job = {
        "jobArn": own["jobArn"], "jobName": own["jobName"], "modelId": own["modelId"], "roleArn": own["roleArn"],
        "status": said, "submitTime": _iso(row.created_at), "lastModifiedTime": _iso(max(stamps)),
        "inputDataConfig": {"s3InputDataConfig": {"s3Uri": own["input"], "s3InputFormat": "JSONL"}},
        "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": own["output"]}},
        "timeoutDurationInHours": own["hours"], "jobExpirationTime": _iso(row.expires_at), "modelInvocationType": "InvokeModel",
        "totalRecordCount": row.total, "processedRecordCount": counts["succeeded"] + counts["failed"],
        "successRecordCount": counts["succeeded"], "errorRecordCount": counts["failed"],
    }  # fmt: skip
    if own["clientRequestToken"] is not None:
        job["clientRequestToken"] = own["clientRequestToken"]
    if ended is not None:
        job["endTime"] = _iso(ended)
    if row.errors:
        job["message"] = "; ".join(e["message"] for e in json.loads(row.errors)["data"])[:2048]
    return job


@router.get("/model-invocation-job/{identifier:path}")
async def get(identifier: str, request: Request) -> Any:
    server = _server(request)
    return await _answer(lambda: job_object(server, _settled(server, _row(server, identifier))))


@router.get("/model-invocation-jobs")
async def list_(request: Request) -> Any:
    return await _answer(_list, _server(request), dict(request.query_params))


def _when(query: dict[str, str], key: str) -> float | None:
    text = query.get(key)
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise invalid(f"{key} must be a timestamp, not {text!r}.") from None


def _list(server: Server, query: dict[str, str]) -> dict[str, Any]:
    """Newest first (sortOrder Descending, the default) or oldest first; filtered by
    nameContains, statusEquals, submitTimeAfter/Before; pages of maxResults (1 to 1000)."""
    try:
        size = int(query.get("maxResults", 1000))
        start = int(query.get("nextToken", 0))
    except ValueError:
        raise invalid("maxResults and nextToken must be numbers here.") from None
    if not 1 <= size <= 1000:
        raise invalid(f"maxResults must be between 1 and 1000, not {size}.")
    after, before = _when(query, "submitTimeAfter"), _when(query, "submitTimeBefore")
    jobs = []
    for row in _rows(server):
        if query.get("nameContains", "") not in _own(row)["jobName"]:
            continue
        if (after is not None and row.created_at <= after) or (before is not None and row.created_at >= before):
            continue
        job = job_object(server, _settled(server, row))
        if query.get("statusEquals") in (None, job["status"]):
            jobs.append(job)
    if query.get("sortOrder") == "Ascending":
        jobs.reverse()
    page = {"invocationJobSummaries": jobs[start : start + size]}
    if start + size < len(jobs):
        page["nextToken"] = str(start + size)
    return page


@router.post("/model-invocation-job/{identifier:path}/stop")
async def stop(identifier: str, request: Request) -> Any:
    server = _server(request)
    return await _answer(_stop, server, identifier)


def _stop(server: Server, identifier: str) -> dict[str, Any]:
    row = _row(server, identifier)
    status = records.begin_cancel(server, row.id, lambda: S(_row(server, identifier).status))
    if status in TERMINAL or status is S.FINALIZING:
        raise invalid(f"The batch inference job {identifier} cannot be stopped: it is {STATUS[status]}.")
    return {}
