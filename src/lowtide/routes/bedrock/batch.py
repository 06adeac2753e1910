"""`bedrock-batch`: AWS Bedrock's batch inference (model invocation jobs) on boto3, with its
input and output in S3 through s3fs (core/locations.py).

One job per dispatch, of one model: the requests are written as a JSONL file of
`{"recordId", "modelInput"}` records (routes/bedrock/wire.py; Claude models only) to
`{staging}/{key}/{key}.jsonl`, then `CreateModelInvocationJob` runs it with the dispatch's
key as both the job's name and its `clientRequestToken`. The token is Bedrock's idempotency
key: a create sent again with it (boto3's own retries, or a resubmit after a crash) answers
the job the first one made, never a second. After a crash between create and recording its
ARN, `find` lists the jobs whose name holds the key and adopts the one that has it.

Bedrock writes `{staging}/{key}/out/{job id}/{key}.jsonl.out` (one record per input record:
`modelOutput` or `error`) and `manifest.json.out`; the route streams the first back. The
files stay in the user's bucket until they delete them (a lifecycle rule on the prefix): a
job that answered (its record counts) whose output is not there, or a file gone before it is
read, was deleted: `ResultsGone`, which the engine gives up after its grace (engine/batches.py
`_not_read`), not a download read again for ever.

States (the card's status map): Submitted, Validating, Scheduled and InProgress run,
Stopping is cancelling; Completed and PartiallyCompleted end with their output read (an
errored record fails alone); Stopped and Expired end with what was answered, the rest have
no record and are treated by the engine as cancelled or expired (retried, or sent to the
fallback); Failed fails the batch with Bedrock's message. A chunk under Bedrock's minimum
(the card's `limits.min_requests`, 100 records a job) is refused before anything is sent:
Bedrock would fail the job in validation.

Options: `role_arn` (required: the service role Bedrock reads and writes S3 with),
`staging` (an s3:// prefix for input and output; or `bucket`, giving s3://BUCKET/lowtide),
`region` (default AWS_REGION / AWS_DEFAULT_REGION / the profile's), `profile` (a named AWS
profile), `endpoint_url` (Bedrock's control plane elsewhere, as `lowtide serve`; S3's is
AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL as boto3 reads them), `max_requests`, `max_bytes`
(the card's or tighter), `timeout_hours` (the job's own, 24 to 168, default 24),
`poll_interval` ([first, longest] seconds, default [60, 900]). Credentials come from AWS's
own chain (environment, profile, SSO, instance role; AWS_BEARER_TOKEN_BEDROCK for Bedrock's
API keys), never from the spec; none is kept or logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
from collections.abc import AsyncIterator, Collection, Iterable
from typing import IO, Any, Literal
from urllib.parse import urlsplit

import boto3
import botocore.exceptions

from lowtide.core import fastjson
from lowtide.core.cards import CARDS
from lowtide.core.errors import BatchGone, BatchRejected, NotSent, ResultsGone, RouteError
from lowtide.core.locations import location
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.base import BatchStatus
from lowtide.routes.bedrock import wire
from lowtide.routes.openai.batch import jsonl_file
from lowtide.routes.options import number_option, secret_of, text_option
from lowtide.routes.provider import batch_limits, check_options, poll_interval

log = logging.getLogger(__name__)
NAME = "bedrock-batch"
CARD = CARDS[NAME]  # limits, states, retention, how a job is found (core/cards.py)
TERMINAL = CARD.ended_states()
OPTIONS = {"role_arn", "staging", "bucket", "region", "profile", "endpoint_url", "max_requests", "max_bytes", "timeout_hours",
           "poll_interval"}  # fmt: skip
ROLE = re.compile(r"arn:aws(-[^:]+)?:iam::([0-9]{12})?:role/.+")  # botocore's RoleArn pattern
# botocore's S3Uri pattern: a lower-case bucket, then keys of these characters only.
S3_URI = re.compile(r"s3://[a-z0-9][-.a-z0-9]{1,61}[a-z0-9](?:/[-!_*'().a-z0-9A-Z]+(?:/[-!_*'().a-z0-9A-Z]+)*)?/?")
REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]+")  # us-east-1, ap-southeast-2, us-gov-west-1
BLOCK = 1 << 20  # bytes read from S3 at a time
# Refusals that sending the same create again cannot fix; any other error is transient.
PERMANENT = frozenset({"ValidationException", "AccessDeniedException", "ResourceNotFoundException"})


class BedrockBatchRoute:
    kind: Literal["batch"] = "batch"
    name = NAME
    group_by_prefix = True  # requests sharing a prompt prefix go together

    def __init__(self, options: dict[str, Any]):
        check_options(self.name, options, OPTIONS)
        self.card = CARD
        self.limits = batch_limits(self.name, options)
        self.min_records = CARD.limits.min_requests or 1
        # Each option given is checked first, so a bad value is named before anything missing.
        role, staging = _role(options), _staging(options)
        self.timeout_hours = number_option(self.name, options, "timeout_hours", 24, int, 24)
        if self.timeout_hours > 168:
            raise RouteError(f"{self.name}: route_options.timeout_hours is {self.timeout_hours}; Bedrock takes 24 to 168 hours")
        endpoint_url = _endpoint(options)
        self.poll_interval = poll_interval(options | {"base_url": endpoint_url}, (60.0, 900.0))
        region = text_option(self.name, options, "region")
        if region is not None and not REGION.fullmatch(region):
            raise RouteError(f"{self.name}: route_options.region {region!r} is not an AWS region; give one such as us-east-1")
        session = _session(text_option(self.name, options, "profile"), region)
        # Then what is missing: the role, the S3 place, the region, the credentials.
        if role is None:
            raise RouteError(f"{NAME}: no IAM role: set route_options.role_arn to the ARN of the service role Bedrock runs the "
                             "job as (it reads the input and writes the output in S3), e.g. arn:aws:iam::123456789012:role/BedrockBatch")  # fmt: skip
        if staging is None:
            raise RouteError(f"{NAME}: no S3 place for the job's input and output: set route_options.staging to an s3:// prefix "
                             "(s3://BUCKET/PREFIX, in the job's region) or route_options.bucket")  # fmt: skip
        self.role_arn, self.staging = role, staging
        credentials = _credentials(session)
        self.region = session.region_name
        # scrubbed from the errors the engine keeps (routes/base.py); never stored
        self.secret = secret_of(credentials.secret_key if credentials is not None else os.environ.get("AWS_BEARER_TOKEN_BEDROCK"))
        # boto3 at its defaults (its retries resend a create with the same token: no second job)
        self.client = session.client("bedrock", endpoint_url=endpoint_url)
        self.store = location(self.staging)  # s3fs, with the same chain's credentials and endpoint
        self.endpoint = endpoint_url or f"Bedrock in {self.region}"

    def check_model(self, model: str) -> None:
        wire.check_model(self.name, model)

    def refusal(self, request: Request) -> Refusal | None:
        return wire.refusal(request, self.name)

    async def submit(self, key: str, requests: Iterable[Request]) -> str:
        counted = 0

        def record(request: Request) -> dict[str, Any]:
            nonlocal counted
            counted += 1
            try:
                return wire.record(request)
            except ValueError as err:
                raise BatchRejected(f"{self.name}: request {request.custom_id}: {err}") from None

        with jsonl_file(self.name, requests, record, "batch job") as (f, model, _endpoint):
            if counted < self.min_records:
                raise BatchRejected(
                    f"{self.name}: a Bedrock batch job takes at least {self.min_records} records (AWS's quota \"Minimum number "
                    f"of records per batch inference job\"); this chunk of {model} has {counted}. Send at least "
                    f"{self.min_records} requests of one model in a job, or run these on a real-time route (route: anthropic, "
                    "or a fallback)"
                )  # fmt: skip
            input_uri = f"{self.staging}/{key}/{key}.jsonl"
            await asyncio.to_thread(self._put, f, input_uri)
            try:
                answer = await asyncio.to_thread(
                    self.client.create_model_invocation_job, jobName=key, clientRequestToken=key, roleArn=self.role_arn,
                    modelId=model, timeoutDurationInHours=self.timeout_hours,
                    inputDataConfig={"s3InputDataConfig": {"s3Uri": input_uri, "s3InputFormat": "JSONL"}},
                    outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"{self.staging}/{key}/out/"}},
                )  # fmt: skip
            except botocore.exceptions.ClientError as err:
                raise _create_error(self.name, err) from None
            except botocore.exceptions.EndpointConnectionError as err:  # never connected: no job to find after this
                raise NotSent(f"{self.name}: could not connect to {self.endpoint}: {err}") from None
        return answer["jobArn"]

    def _put(self, f: IO[bytes], uri: str) -> None:
        """Stream the spooled input file to S3 (multipart past s3fs's block size)."""
        path = uri.removeprefix("s3://")
        with self.store.errors(), self.store.fs.open(path, "wb") as out:
            shutil.copyfileobj(f, out, BLOCK)

    async def find(
        self, key: str, size: int, not_before: float, known: Collection[str] = (), sent: Collection[str] | None = None
    ) -> str | None:
        """The job named by the key whose token is the key (a name alone may be another's)."""
        asked: dict[str, Any] = {"nameContains": key, "sortBy": "CreationTime", "sortOrder": "Descending"}
        while True:
            page = await asyncio.to_thread(self.client.list_model_invocation_jobs, **asked)
            for job in page.get("invocationJobSummaries", []):
                if job.get("jobName") == key and job.get("clientRequestToken") == key:
                    return job["jobArn"]
            if not page.get("nextToken"):
                return None
            asked["nextToken"] = page["nextToken"]

    async def poll(self, batch_id: str) -> BatchStatus:
        job = await self._get(batch_id)
        status = job.get("status", "Submitted")
        counts = {"total": job.get("totalRecordCount", 0), "processed": job.get("processedRecordCount", 0),
                  "succeeded": job.get("successRecordCount", 0), "failed": job.get("errorRecordCount", 0)}  # fmt: skip
        errors = [job.get("message") or "Bedrock failed the batch job without saying why"] if status == "Failed" else []
        return BatchStatus(phase=status, ended=status in TERMINAL, counts=counts, errors=errors)

    async def _get(self, batch_id: str) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(self.client.get_model_invocation_job, jobIdentifier=batch_id)
        except botocore.exceptions.ClientError as err:
            code, message = _said(err)
            if code == "ResourceNotFoundException":
                raise BatchGone(f"{self.name}: {code} for batch job {batch_id}: {message}") from None
            raise RouteError(f"{self.name}: {code} for batch job {batch_id}: {message}") from None

    async def results(self, batch_id: str) -> AsyncIterator[Outcome]:
        job = await self._get(batch_id)
        out = job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"].rstrip("/")
        folder = f"{out}/{batch_id.rsplit('/', 1)[-1]}".removeprefix("s3://")
        try:
            paths = await asyncio.to_thread(self.store.fs.find, folder)
        except FileNotFoundError:
            paths = []
        paths = sorted(p for p in paths if p.endswith(".out") and not p.endswith("manifest.json.out"))
        answered = (job.get("successRecordCount") or 0) + (job.get("errorRecordCount") or 0)
        if not paths and answered:  # it wrote them, and they are not there: deleted, not a download that broke off
            raise ResultsGone(f"{self.name}: no output records under s3://{folder} (not found), the output of batch job "
                              f"{batch_id}, which answered {answered} record(s): deleted there")  # fmt: skip
        if not paths:
            # A job stopped or expired before its first answer writes none: its requests have no
            # record, so the engine treats them as cancelled or expired (retried, or the fallback).
            log.warning("%s: batch job %s wrote no output under s3://%s", NAME, batch_id, folder)
        for path in paths:
            try:
                async for text in self._lines(path):
                    outcome = _parse(text) if text.strip() else None
                    if outcome is not None:
                        yield outcome
            except FileNotFoundError:  # s3fs's NoSuchKey: deleted since it was listed
                raise ResultsGone(f"{self.name}: s3://{path} not found, the output of batch job {batch_id}: deleted there "
                                  "since it was listed") from None  # fmt: skip

    async def _lines(self, path: str) -> AsyncIterator[bytes]:
        """The lines of an S3 object, read a block at a time off the event loop."""
        f = await asyncio.to_thread(self.store.fs.open, path, "rb", block_size=BLOCK)
        try:
            rest = b""
            while block := await asyncio.to_thread(f.read, BLOCK):
                lines = (rest + block).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    yield line
            if rest:
                yield rest
        finally:
            await asyncio.to_thread(f.close)

    async def cancel(self, batch_id: str) -> None:
        await asyncio.to_thread(self.client.stop_model_invocation_job, jobIdentifier=batch_id)

    async def aclose(self) -> None:
        self.client.close()


def _parse(text: bytes) -> Outcome | None:
    """An output record; a corrupt one names no request: skipped (logged), so it is retried."""
    try:
        return wire.outcome(fastjson.loads(text))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as err:
        log.warning("%s: skipped an unreadable output record (%s): %.200s", NAME, err, text)
        return None


def _said(err: botocore.exceptions.ClientError) -> tuple[str, str]:
    error = err.response.get("Error", {})
    return str(error.get("Code") or "Error"), str(error.get("Message") or err)


def _create_error(route: str, err: botocore.exceptions.ClientError) -> RouteError:
    """A refusal sending the same job again cannot fix fails its requests; anything else
    (throttling, a full job quota, a server error) is transient: the next tick
    finds-or-submits again, with the same token."""
    code, message = _said(err)
    said = f"{route}: {code}: {message}"
    return BatchRejected(said) if code in PERMANENT else RouteError(said)


def _role(options: dict[str, Any]) -> str | None:
    role = text_option(NAME, options, "role_arn")
    if role is not None and not ROLE.fullmatch(role):
        raise RouteError(f"{NAME}: route_options.role_arn {role!r} is not an IAM role ARN; give arn:aws:iam::ACCOUNT:role/NAME")
    return role


def _endpoint(options: dict[str, Any]) -> str | None:
    url = text_option(NAME, options, "endpoint_url")
    parts = urlsplit(url) if url else None
    if parts is not None and (parts.scheme not in ("http", "https") or not parts.netloc):
        raise RouteError(f"{NAME}: route_options.endpoint_url {url!r} is not an http(s) URL; give e.g. http://127.0.0.1:8000 "
                         "(lowtide serve), or leave it out for Bedrock's own endpoint in the region")  # fmt: skip
    return url


def _staging(options: dict[str, Any]) -> str | None:
    staging, bucket = text_option(NAME, options, "staging"), text_option(NAME, options, "bucket")
    if staging and bucket:
        raise RouteError(f"{NAME}: give route_options.staging (an s3:// prefix) or route_options.bucket, not both")
    if bucket:
        staging = f"s3://{bucket}/lowtide"
    if not staging:
        return None
    staging = staging.rstrip("/")
    if not S3_URI.fullmatch(staging):
        given = f"route_options.bucket {bucket!r}" if bucket else f"route_options.staging {staging!r}"
        raise RouteError(f"{NAME}: {given} is not an S3 place Bedrock takes: s3://BUCKET/PREFIX, the bucket 3 to 63 "
                         "lower-case letters, digits, - and ., the prefix of letters, digits and -!_*'(). only")  # fmt: skip
    return staging


def _session(profile: str | None, region: str | None) -> boto3.Session:
    """A boto3 session on AWS's own credential chain; a named profile that is not there is
    refused, naming it."""
    try:
        session = boto3.Session(profile_name=profile, region_name=region)
        if not session.region_name and os.environ.get("AWS_REGION"):  # the SDKs' other variable, which botocore skips
            session = boto3.Session(profile_name=profile, region_name=os.environ["AWS_REGION"])
    except botocore.exceptions.ProfileNotFound:
        raise RouteError(f"{NAME}: no AWS profile {profile!r} in ~/.aws/config or ~/.aws/credentials; "
                         "fix route_options.profile, or leave it out") from None  # fmt: skip
    return session


def _credentials(session: boto3.Session) -> Any:
    """The session's credentials (None with a Bedrock API key instead); a missing region or
    missing credentials are refused here, before anything is stored or sent, naming the fix."""
    if not session.region_name:
        raise RouteError(f"{NAME}: no AWS region: set route_options.region, or AWS_REGION / AWS_DEFAULT_REGION, or a profile's "
                         "region (the job runs there; its S3 bucket must be in the same region)")  # fmt: skip
    try:
        credentials = session.get_credentials()
    except botocore.exceptions.BotoCoreError as err:
        raise RouteError(f"{NAME}: AWS credentials could not be read ({type(err).__name__}); fix the profile or the environment") from None
    if credentials is None and not os.environ.get("AWS_BEARER_TOKEN_BEDROCK"):
        raise RouteError(f"{NAME}: no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, name a profile "
                         "(route_options.profile or AWS_PROFILE), sign in with aws sso login, or run with an instance role; "
                         "never in the spec")  # fmt: skip
    return credentials


def create(options: dict[str, Any]) -> BedrockBatchRoute:
    return BedrockBatchRoute(options)

