"""`anthropic-batch`: Anthropic's Message Batches API (or any server speaking it).

Anthropic keeps no metadata on a batch, so exactly-once submission cannot rely on a key.
After a crash between "create sent" and "id recorded", `find` lists recent batches and looks
at those created within `find_window` seconds (default 600) after its create began (the
engine passes the dispatch's `submit_started_at`, recorded just before the call, not the
time it was planned) with exactly the dispatch's number of requests. Such a batch may be
another client's on the same key, and nothing Anthropic shows about a running batch tells
them apart (no metadata; its requests are readable only once it has ended), so a candidate
is adopted only once it has ended and its results hold none but the dispatch's custom_ids
(`sent`). While one still runs, `find` raises: the dispatch waits in `submitting`, and
nothing that may be another client's is polled, cancelled or ingested. Candidates that each
hold a request not ours prove the create never arrived (ours would be among them), and the
chunk is sent again; two that could be ours are refused, not guessed between.

Options: `base_url`, `api_key_env` (default ANTHROPIC_API_KEY), `max_requests`
(≤ 100,000), `max_bytes` (≤ 256 MB), `poll_interval`, `find_window`, `cache_prefix`
(true: mark the system prompt `cache_control: ephemeral, ttl 1h`, the TTL that suits
batches), `timeout`.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncIterator, Collection, Iterable
from typing import Any, Literal

import anthropic

from lowtide.core import fastjson
from lowtide.core.cards import CARDS
from lowtide.core.errors import BatchGone, BatchRejected, NotSent, RouteError
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.anthropic.wire import anthropic_outcome, anthropic_params, anthropic_refusal
from lowtide.routes.base import BatchStatus, LazyClient
from lowtide.routes.options import flag_option, number_option, secret_of, text_option
from lowtide.routes.provider import (
    RETRYABLE_CODES,
    api_key,
    batch_limits,
    check_options,
    never_sent,
    poll_interval,
)
from lowtide.routes.wire import text_or_none

log = logging.getLogger(__name__)
TERMINAL = CARDS["anthropic-batch"].ended_states()  # "ended" (core/cards.py)
OPTIONS = {"base_url", "api_key_env", "max_requests", "max_bytes", "poll_interval", "find_window", "cache_prefix", "timeout"}


def batch_request(request: Request, cache_prefix: bool) -> dict[str, Any]:
    """One entry of `requests` in a create call: the body verbatim (or translated from chat)."""
    params = anthropic_params(request, "1h" if cache_prefix else None)
    if isinstance(params, Refusal):  # the loader refuses these; a store from before it did, here
        raise BatchRejected(f"anthropic-batch: request {request.custom_id}: {params.message('anthropic-batch')}")
    return {"custom_id": request.custom_id, "params": params}


def parse_result(custom_id: str, result: Any) -> Outcome:
    """One result line's `result` (SDK object or dict), as an Outcome."""
    data = result.model_dump() if hasattr(result, "model_dump") else result
    kind = data.get("type")
    if kind == "succeeded":
        return anthropic_outcome(custom_id, data["message"], batch=True)
    if kind == "errored":
        error = (data.get("error") or {}).get("error") or {}
        code = text_or_none(error.get("type")) or "api_error"
        return Outcome.failure(custom_id, code, text_or_none(error.get("message")) or code, code in RETRYABLE_CODES)
    if kind in ("canceled", "expired"):
        return Outcome.failure(custom_id, "batch_cancelled" if kind == "canceled" else "batch_expired", f"request {kind}", True)
    return Outcome.failure(custom_id, "unknown_result", f"unknown result type {kind!r}", True)


class AnthropicBatchRoute(LazyClient):
    kind: Literal["batch"] = "batch"
    name = "anthropic-batch"
    group_by_prefix = True

    def __init__(self, options: dict[str, Any]):
        check_options(self.name, options, OPTIONS)
        self.limits = batch_limits(self.name, options)
        self.poll_interval = poll_interval(options, (30.0, 600.0))
        self.find_window = number_option(self.name, options, "find_window", 600, float)
        self.cache_prefix = flag_option(self.name, options, "cache_prefix", False)
        key = api_key(self.name, options, "ANTHROPIC_API_KEY")
        self.secret = secret_of(key)  # scrubbed from the errors the engine keeps (routes/base.py)
        self.make_client = functools.partial(
            anthropic.AsyncAnthropic,
            api_key=key,
            base_url=text_option(self.name, options, "base_url"),
            # Per read or write, not per call: a stalled download gives up and the next poll resumes.
            timeout=number_option(self.name, options, "timeout", 120, float, 1e-3),
        )

    def check_model(self, model: str) -> None:
        """Unknown models come back as errored results, per request."""

    def refusal(self, request: Request) -> Refusal | None:
        return anthropic_refusal(request)

    async def submit(self, key: str, requests: Iterable[Request]) -> str:
        # The SDK sends one JSON body, so the batch is built whole here (Anthropic's limit
        # is 256 MB a batch; chunk_size or route_options.max_requests keeps it smaller).
        body = [batch_request(r, self.cache_prefix) for r in requests]
        try:
            batch = await self.client.with_options(max_retries=0).messages.batches.create(requests=body)
        except anthropic.APIStatusError as err:
            message = f"{self.name}: HTTP {err.status_code}: {err.message}"
            if err.status_code in (400, 401, 403, 404, 413, 422):
                raise BatchRejected(message) from None
            raise RouteError(message) from None
        except anthropic.APIConnectionError as err:
            if never_sent(err):  # no connection, so no batch: nothing to find after this
                raise NotSent(f"{self.name}: could not connect to {self.client.base_url}: {err.__cause__ or err}") from None
            raise
        return batch.id

    async def find(
        self, key: str, size: int, not_before: float, known: Collection[str] = (), sent: Collection[str] | None = None
    ) -> str | None:
        """This dispatch's batch, proven by its results holding only `sent` (the custom_ids its
        create carried); None only when no batch in the window can be it."""
        found = [b async for b in self._candidates(size, not_before, known)]
        # Without `sent` nothing can be proven ours: every candidate is waited on as if running.
        running = [b.id for b in found if b.processing_status != "ended" or sent is None]
        ids = set(sent or ())
        ours = [b.id for b in found if b.id not in running and await self._holds_only(b.id, ids)]
        if len(ours) > 1:
            raise RouteError(
                f"{self.name}: {len(ours)} batches ({', '.join(ours)}) match a dispatch of {size} requests "
                "created in the same window; refusing to guess. Cancel the extra one at the provider, "
                "then run `lowtide tick` again"
            )
        if not ours and running:
            raise RouteError(
                f"{self.name}: waiting: batch {', '.join(running)} of {size} requests was created in this dispatch's "
                "window and may be another client's; Anthropic shows a batch's requests only once it has ended, "
                "so it is neither adopted nor sent again before then"
            )
        return ours[0] if ours else None

    async def _candidates(self, size: int, not_before: float, known: Collection[str]) -> AsyncIterator[Any]:
        """Batches of `size` requests created in the window, other than those in `known`."""
        async for batch in self.client.messages.batches.list(limit=100):
            created = batch.created_at.timestamp()
            if created < not_before - 60:  # newest first: everything further is older
                return
            if batch.id in known:  # another dispatch's batch (chunks of a job often have one size)
                continue
            counts = batch.request_counts
            total = counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
            if created <= not_before + self.find_window and total == size:
                yield batch

    async def _holds_only(self, batch_id: str, ours: set[str]) -> bool:
        """Whether an ended batch's results name no custom_id outside `ours` (unreadable lines
        name none: adopting a batch whose lines are all unreadable applies nothing)."""
        async with self.client.messages.batches.with_streaming_response.results(batch_id) as response:
            async for text in response.iter_lines():
                if not text.strip():
                    continue
                try:
                    custom_id = fastjson.loads(text)["custom_id"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue
                if isinstance(custom_id, str) and custom_id not in ours:
                    return False
        return True

    async def poll(self, batch_id: str) -> BatchStatus:
        try:
            batch = await self.client.messages.batches.retrieve(batch_id)
        except anthropic.NotFoundError as err:
            raise BatchGone(f"{self.name}: HTTP 404 for batch {batch_id}: {err.message}") from None
        counts = batch.request_counts.model_dump()
        return BatchStatus(phase=batch.processing_status, ended=batch.processing_status in TERMINAL, counts=counts)

    async def results(self, batch_id: str) -> AsyncIterator[Outcome]:
        # The raw stream, not the SDK's decoder: one corrupt line must not stop the rest. It
        # is skipped (logged), and its request counts as missing, so it is retried.
        async with self.client.messages.batches.with_streaming_response.results(batch_id) as response:
            async for text in response.iter_lines():
                if not text.strip():
                    continue
                try:
                    line = fastjson.loads(text)
                    outcome = parse_result(line["custom_id"], line["result"])
                except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
                    log.warning("anthropic-batch: skipped an unreadable result line (%s): %.200s", err, text)
                    continue
                yield outcome

    async def cancel(self, batch_id: str) -> None:
        await self.client.messages.batches.cancel(batch_id)

    async def aclose(self) -> None:
        if (client := self.made_client()) is not None:
            await client.close()


def create(options: dict[str, Any]) -> AnthropicBatchRoute:
    return AnthropicBatchRoute(options)
