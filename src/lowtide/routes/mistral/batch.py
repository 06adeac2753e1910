"""`mistral-batch`: Mistral's batch jobs, through the official `mistralai` SDK.

One Mistral batch job per dispatch: the requests are written as a JSONL file of
`{"custom_id", "body"}` lines (the body verbatim: Mistral's chat and embeddings APIs are
OpenAI-shaped; a field Mistral's API does not declare is refused before anything is stored,
routes/mistral/wire.py), uploaded with purpose `batch`, and a job is created with the one
model and endpoint of its requests, the dispatch's key in its `metadata` (`lowtide_key`) and
`timeout_hours`. The SDK retries nothing unless told to, so a create is never silently
repeated; after a crash `find` lists the jobs newest first and adopts the one holding the key
(the list's own metadata filter is not relied on: how Mistral reads the SDK's exploded query
is not documented). Mistral keeps results only for a while after a job ends (the card's
`retention.results_s`): a job is polled until it ends and its files are read at once.

States (the card's status map): QUEUED and RUNNING run, CANCELLATION_REQUESTED is cancelling;
SUCCESS, TIMEOUT_EXCEEDED (Mistral's expiry, after `timeout_hours`) and CANCELLED end with
their output and error files read, and a request with no line in either is treated as
expired by the engine (retried, or sent to the fallback route at once, as an expired
openai-batch request); FAILED fails the batch with Mistral's errors.

Options: `base_url` (Mistral's server, default https://api.mistral.ai), `api_key_env`
(default MISTRAL_API_KEY), `max_requests`, `max_bytes` (the card's or tighter),
`timeout_hours` (the job's own, default 24), `poll_interval` ([first, longest] seconds,
default [30, 600]), `find_hours` (how far back `find` looks, 48), `timeout` (seconds a call
may take, 120).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Collection, Iterable
from typing import Any, Literal

from mistralai.client import Mistral
from mistralai.client.errors import MistralError

from lowtide.core import fastjson
from lowtide.core.cards import CARDS
from lowtide.core.endpoints import CHAT
from lowtide.core.errors import BatchGone, BatchRejected, NotSent, RouteError
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.base import BatchStatus
from lowtide.routes.mistral import wire as _mistral_wire
from lowtide.routes.openai.batch import jsonl_file, parse_result_line
from lowtide.routes.options import number_option, secret_of, text_option
from lowtide.routes.provider import api_key, batch_limits, check_options, never_sent, poll_interval

log = logging.getLogger(__name__)
NAME = "mistral-batch"
CARD = CARDS[NAME]  # limits, states, retention, how a job is found (core/cards.py)
TERMINAL = CARD.ended_states()
METADATA_KEY = CARD.recovery.field.removeprefix("metadata.")  # lowtide_key
KEY_ENV = "MISTRAL_API_KEY"
OPTIONS = {"base_url", "api_key_env", "max_requests", "max_bytes", "timeout_hours", "poll_interval", "find_hours", "timeout"}
PAGE = 100  # jobs a list call returns


def request_line(request: Request) -> dict[str, Any]:
    """One input line of a Mistral batch file."""
    return {"custom_id": request.custom_id, "body": request.body}


def counts_of(job: Any) -> dict[str, int]:
    return {"total": job.total_requests, "completed": job.completed_requests,
            "succeeded": job.succeeded_requests, "failed": job.failed_requests}  # fmt: skip


def job_errors(job: Any) -> list[str]:
    """A FAILED job's errors as Mistral gives them (a message, and how many lines it was)."""
    said = [f"{e.message} (×{e.count})" if e.count and e.count > 1 else e.message for e in job.errors or []]
    return said or ["Mistral failed the batch job without saying why"]


class MistralBatchRoute:
    kind: Literal["batch"] = "batch"
    name = NAME
    group_by_prefix = True  # requests sharing a prompt prefix go together

    def __init__(self, options: dict[str, Any]):
        check_options(self.name, options, OPTIONS)
        self.card = CARD
        self.limits = batch_limits(self.name, options)
        base_url = text_option(self.name, options, "base_url")
        self.poll_interval = poll_interval(options | {"base_url": base_url}, (30.0, 600.0))
        self.find_seconds = number_option(self.name, options, "find_hours", 48, float) * 3600
        self.timeout_hours = number_option(self.name, options, "timeout_hours", 24, int, 1)
        timeout = number_option(self.name, options, "timeout", 120, float, 1e-3)
        key = api_key(self.name, options, KEY_ENV)
        self.secret = secret_of(key)  # scrubbed from the errors the engine keeps (routes/base.py)
        # The SDK at its defaults, pointed at `base_url` (None: Mistral's own server).
        self.client = Mistral(api_key=key, server_url=base_url, timeout_ms=int(timeout * 1000))
        self.base_url = base_url or "https://api.mistral.ai"

    def check_model(self, model: str) -> None:
        """Mistral says which models its batch serves: an unknown one fails the job's lines."""

    def refusal(self, request: Request) -> Refusal | None:
        return _mistral_wire.refusal(request, self.name)

    async def submit(self, key: str, requests: Iterable[Request]) -> str:
        with jsonl_file(self.name, requests, request_line, "batch job") as (f, model, endpoint):
            try:
                uploaded = await self.client.files.upload_async(file={"file_name": f"{key}.jsonl", "content": f}, purpose="batch")
                job = await self.client.batch.jobs.create_async(
                    input_files=[uploaded.id], endpoint=endpoint, model=model,
                    metadata={METADATA_KEY: key}, timeout_hours=self.timeout_hours,
                )  # fmt: skip
            except MistralError as err:
                raise _create_error(self.name, err) from None
            except Exception as err:
                if never_sent(err):  # no connection, so no job: nothing to find after this
                    raise NotSent(f"{self.name}: could not connect to {self.base_url}: {err}") from None
                raise
        return job.id

    async def find(
        self, key: str, size: int, not_before: float, known: Collection[str] = (), sent: Collection[str] | None = None
    ) -> str | None:
        oldest = min(not_before - 3600, not_before - self.find_seconds)  # clocks differ; look a little further back
        page = 0
        while True:
            listed = await self.client.batch.jobs.list_async(page=page, page_size=PAGE, order_by="-created")
            jobs = listed.data or []
            for job in jobs:
                if (job.metadata or {}).get(METADATA_KEY) == key:
                    return job.id
                if job.created_at < oldest:  # newest first: everything further is older
                    return None
            if len(jobs) < PAGE:
                return None
            page += 1

    async def poll(self, batch_id: str) -> BatchStatus:
        try:
            job = await self.client.batch.jobs.get_async(job_id=batch_id)
        except MistralError as err:
            if err.status_code == 404:
                raise BatchGone(f"{self.name}: HTTP 404 for batch job {batch_id}: {err.body[:500]}") from None
            raise RouteError(f"{self.name}: HTTP {err.status_code} for batch job {batch_id}: {err.body[:500]}") from None
        errors = job_errors(job) if job.status == "FAILED" else []
        return BatchStatus(phase=job.status, ended=job.status in TERMINAL, counts=counts_of(job), errors=errors)

    async def results(self, batch_id: str) -> AsyncIterator[Outcome]:
        job = await self.client.batch.jobs.get_async(job_id=batch_id)
        endpoint = job.endpoint or CHAT
        for file_id in (job.output_file, job.error_file):
            if not file_id:
                continue
            try:
                response = await self.client.files.download_async(file_id=file_id)
            except MistralError as err:
                if err.status_code != 404:
                    raise
                # Past Mistral's retention its files are gone: the requests they answered have
                # no line, so the engine treats them as expired (retried, or sent to the fallback).
                log.warning("%s: batch job %s: file %s is gone (HTTP 404): its requests count as expired", NAME, batch_id, file_id)
                continue
            try:
                async for text in response.aiter_lines():
                    outcome = _parse(text, endpoint) if text.strip() else None
                    if outcome is not None:
                        yield outcome
            finally:
                await response.aclose()

    async def cancel(self, batch_id: str) -> None:
        await self.client.batch.jobs.cancel_async(job_id=batch_id)

    async def aclose(self) -> None:
        await self.client.__aexit__(None, None, None)


def _parse(text: str, endpoint: str) -> Outcome | None:
    """A result line (Mistral writes OpenAI's shape: `custom_id`, `response.status_code` and
    `.body`, or `error`). A corrupt one names no request: skipped (logged), so it is retried."""
    try:
        return parse_result_line(fastjson.loads(text), endpoint)
    except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as err:
        log.warning("%s: skipped an unreadable result line (%s): %.200s", NAME, err, text)
        return None


def _create_error(route: str, err: MistralError) -> RouteError:
    """A refusal that sending the same job again cannot fix fails its requests; anything else
    is transient and the next tick finds-or-submits again."""
    message = f"{route}: HTTP {err.status_code}: {err.body[:1000]}"
    if err.status_code in (400, 401, 403, 404, 413, 422):
        return BatchRejected(message)
    return RouteError(message)


def create(options: dict[str, Any]) -> MistralBatchRoute:
    return MistralBatchRoute(options)
