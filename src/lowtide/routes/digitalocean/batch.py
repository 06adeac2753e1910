"""`digitalocean-batch`: DigitalOcean's batch inference, through the official `pydo` SDK.

One DigitalOcean batch per dispatch, provider `openai`: the requests are written as a JSONL
file of OpenAI's `{"custom_id", "method", "url", "body"}` lines, a file intent is made
(`create_batch_file`), the bytes are PUT to its presigned `upload_url` (with httpx: pydo's
own upload is synchronous and takes no URL of ours), and the batch is created with the
file's id, the endpoint and the dispatch's key as its `request_id`, DigitalOcean's
idempotency key: a create repeating it answers the batch it made. The SDK's retries are off
(the engine retries); after a crash `find` lists batches newest first and adopts the one
holding the key. Results are read through the short-lived download links of
`get_batch_results`, fetched as soon as a poll sees the batch ended.

Anthropic-shaped requests (DigitalOcean's provider `anthropic`) are not sent yet: refused by
name before anything is stored. States are OpenAI's (the card's status map).

Options: `base_url` (default https://inference.do-ai.run), `api_key_env` (default
MODEL_ACCESS_KEY, a model access key), `max_requests`, `max_bytes` (the card's or tighter),
`poll_interval` ([first, longest] seconds, default [30, 600]), `find_hours` (how far back
`find` looks, 48), `timeout` (seconds a call may take, 120).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Collection, Iterable
from datetime import datetime
from typing import Any, Literal

import httpx
from azure.core.exceptions import HttpResponseError
from pydo.inference.aio import Client

from lowtide.core import fastjson
from lowtide.core.cards import CARDS
from lowtide.core.endpoints import CHAT, MESSAGES
from lowtide.core.errors import BatchGone, BatchRejected, NotSent, RouteError
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.base import BatchStatus
from lowtide.routes.openai.batch import jsonl_file, parse_result_line, request_line
from lowtide.routes.openai.wire import openai_refusal
from lowtide.routes.options import number_option, secret_of, text_option
from lowtide.routes.provider import api_key, batch_limits, check_options, never_sent, poll_interval

log = logging.getLogger(__name__)
NAME = "digitalocean-batch"
CARD = CARDS[NAME]  # limits, states, retention, how a batch is found (core/cards.py)
TERMINAL = CARD.ended_states()
KEY_ENV = "MODEL_ACCESS_KEY"
BASE_URL = "https://inference.do-ai.run"
OPTIONS = {"base_url", "api_key_env", "max_requests", "max_bytes", "poll_interval", "find_hours", "timeout"}
PAGE = 100  # batches a list call returns (DigitalOcean's most)


def _when(text: str | None) -> float:
    """DigitalOcean's ISO 8601 time as epoch seconds (0 when absent)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else 0.0


class DigitalOceanBatchRoute:
    kind: Literal["batch"] = "batch"
    name = NAME
    group_by_prefix = True  # requests sharing a prompt prefix go together

    def __init__(self, options: dict[str, Any]):
        check_options(self.name, options, OPTIONS)
        self.card = CARD
        self.limits = batch_limits(self.name, options)
        self.base_url = (text_option(self.name, options, "base_url") or BASE_URL).rstrip("/")
        self.poll_interval = poll_interval(options | {"base_url": self.base_url}, (30.0, 600.0))
        self.find_seconds = number_option(self.name, options, "find_hours", 48, float) * 3600
        timeout = number_option(self.name, options, "timeout", 120, float, 1e-3)
        key = api_key(self.name, options, KEY_ENV)
        self.secret = secret_of(key)  # scrubbed from the errors the engine keeps (routes/base.py)
        # retry_total=0: the SDK repeats nothing; the engine finds-or-submits on its next tick.
        self.client = Client(token=key, inference_endpoint=self.base_url, timeout=int(max(timeout, 1)), retry_total=0)
        self.http = httpx.AsyncClient(timeout=timeout)  # presigned URLs only: no key goes there
        # azure-core sends a bearer token over https only unless told per call: a plain-http
        # base_url (lowtide serve on loopback) needs the word.
        self.call = {"enforce_https": False} if self.base_url.startswith("http://") else {}

    def check_model(self, model: str) -> None:
        """DigitalOcean says which models its batch serves (OpenAI's and Anthropic's text models)."""

    def refusal(self, request: Request) -> Refusal | None:
        if request.endpoint == MESSAGES:
            return Refusal("endpoint", f"{self.name} sends DigitalOcean's provider `openai` batches only; Anthropic-shaped "
                                       f"requests ({MESSAGES}) are not sent yet: use anthropic-batch, or send {CHAT}")  # fmt: skip
        if request.endpoint not in CARD.endpoints:
            return Refusal("endpoint", f"DigitalOcean's batch takes {', '.join(CARD.endpoints)} here ({self.name}), "
                                       f"not {request.endpoint}; use another route for this endpoint")  # fmt: skip
        return openai_refusal(request, self.name)  # a stream, as every OpenAI-shaped batch route refuses it

    async def submit(self, key: str, requests: Iterable[Request]) -> str:
        with jsonl_file(self.name, requests, request_line, "batch") as (f, _model, endpoint):
            try:
                intent = _refused_or(await self._call("create_batch_file", {"file_name": f"{key}.jsonl"}), "file intent")
                await self._put(intent["upload_url"], f.read())
                batch = _refused_or(await self._call("create_batch", {
                    "file_id": intent["file_id"], "provider": "openai", "endpoint": endpoint,
                    "completion_window": "24h", "request_id": key,
                }), "batch")  # fmt: skip
            except HttpResponseError as err:
                raise _create_error(self.name, err) from None
            except Exception as err:
                if never_sent(err):  # no connection, so no batch: nothing to find after this
                    raise NotSent(f"{self.name}: could not connect to {self.base_url}: {err}") from None
                raise
        return batch["batch_id"]

    async def _call(self, operation: str, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        """A pydo call's HTTP status and body: pydo answers some refusals (400, 403, 404, 409, 412,
        422 by operation) as a body rather than raising, so the status is read here."""
        return await getattr(self.client.inference, operation)(*args, cls=_with_status, **self.call, **kwargs)

    async def _put(self, url: str, data: bytes) -> None:
        """The file's bytes to its presigned URL, with no Content-Type (the signature may cover one)."""
        response = await self.http.put(url, content=data)
        if response.status_code >= 300:
            raise RouteError(f"{self.name}: the upload to the presigned URL was refused (HTTP {response.status_code}): "
                             f"{response.text[:500]}")  # fmt: skip

    async def find(
        self, key: str, size: int, not_before: float, known: Collection[str] = (), sent: Collection[str] | None = None
    ) -> str | None:
        oldest = min(not_before - 3600, not_before - self.find_seconds)  # clocks differ; look a little further back
        after = None
        while True:
            status, listed = await self._call("list_batches", limit=PAGE, after=after)
            if status != 200:
                raise RouteError(f"{self.name}: HTTP {status} listing batches: {_message(listed)}")
            batches = listed.get("data") or []
            for batch in batches:
                if batch.get("request_id") == key:
                    return batch["batch_id"]
                if _when(batch.get("created_at")) < oldest:  # newest first: everything further is older
                    return None
            after = listed.get("last_id")
            if not batches or not listed.get("has_more") or not after:
                return None

    async def poll(self, batch_id: str) -> BatchStatus:
        try:
            code, batch = await self._call("get_batch", batch_id)
        except HttpResponseError as err:
            if err.status_code == 404:
                raise BatchGone(f"{self.name}: HTTP 404 for batch {batch_id}: {_said(err)}") from None
            raise RouteError(f"{self.name}: HTTP {err.status_code} for batch {batch_id}: {_said(err)}") from None
        if code == 404:
            raise BatchGone(f"{self.name}: HTTP 404 for batch {batch_id}: {_message(batch)}")
        if code != 200:
            raise RouteError(f"{self.name}: HTTP {code} for batch {batch_id}: {_message(batch)}")
        status = batch["status"]
        counts = batch.get("request_counts") or {}
        errors = [e.get("message") or str(e) for e in batch.get("errors") or []] if status == "failed" else []
        if status == "failed" and not errors:
            errors = ["DigitalOcean failed the batch without saying why"]
        return BatchStatus(phase=status, ended=status in TERMINAL, counts=counts, errors=errors)

    async def results(self, batch_id: str) -> AsyncIterator[Outcome]:
        code, batch = await self._call("get_batch", batch_id)
        if code != 200:
            raise RouteError(f"{self.name}: HTTP {code} for batch {batch_id}: {_message(batch)}")
        endpoint = batch.get("endpoint") or CHAT
        code, links = await self._call("get_batch_results", batch_id)
        if code != 200 or not links.get("result_available", True):  # 412 or not yet: read again on a later tick
            raise RouteError(f"{self.name}: batch {batch_id}'s results are not available yet (HTTP {code}): {_message(links)}")
        for url in (links.get("output_file_url"), links.get("error_file_url")):
            if not url:
                continue
            # Read whole before yielding: the engine may pause between outcomes longer than a
            # streamed connection to a presigned URL stays open.
            response = await self.http.get(url)
            if response.status_code == 404:  # past the card's retention: its requests count as expired
                log.warning("%s: batch %s: a result file is gone (HTTP 404): its requests count as expired", NAME, batch_id)
                continue
            if response.status_code >= 300:
                raise RouteError(f"{self.name}: HTTP {response.status_code} reading batch {batch_id}'s results")
            for text in response.text.splitlines():
                outcome = _parse(text, endpoint) if text.strip() else None
                if outcome is not None:
                    yield outcome

    async def cancel(self, batch_id: str) -> None:
        await self._call("cancel_batch", batch_id)  # 404 or 409 (already ended): nothing to cancel

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.client.close()


def _with_status(pipeline_response: Any, body: Any, headers: Any) -> tuple[int, Any]:
    return pipeline_response.http_response.status_code, body


def _message(body: Any) -> str:
    return str(body.get("message") if isinstance(body, dict) and body.get("message") else body)[:500]


def _refused_or(answer: tuple[int, Any], what: str) -> dict[str, Any]:
    """The body of a created `what`; a refusal answered as a body is one sending again cannot fix."""
    status, body = answer
    if status >= 300:
        raise BatchRejected(f"{NAME}: HTTP {status} creating the {what}: {_message(body)}")
    return body


def _said(err: HttpResponseError) -> str:
    return (err.message or "")[:500]


def _parse(text: str, endpoint: str) -> Outcome | None:
    """A result line (OpenAI's shape for provider openai). A corrupt one names no request:
    skipped (logged), so it is retried."""
    try:
        return parse_result_line(fastjson.loads(text), endpoint)
    except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as err:
        log.warning("%s: skipped an unreadable result line (%s): %.200s", NAME, err, text)
        return None


def _create_error(route: str, err: HttpResponseError) -> RouteError:
    """A refusal that sending the same batch again cannot fix fails its requests; anything
    else is transient and the next tick finds-or-submits again."""
    message = f"{route}: HTTP {err.status_code}: {(err.message or '')[:1000]}"
    if err.status_code in (400, 401, 403, 404, 413, 422):
        return BatchRejected(message)
    return RouteError(message)


def create(options: dict[str, Any]) -> DigitalOceanBatchRoute:
    return DigitalOceanBatchRoute(options)
