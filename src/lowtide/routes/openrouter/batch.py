"""`openrouter-batch`: OpenRouter's Batch API (or any server speaking it, like `lowtide serve`).

One batch per dispatch, sent inline (no files): `POST /batches` with the batch's `endpoint`
and `model` ahead of its `requests` (`{"custom_id", "body"}` each, the body verbatim), through
the official `openrouter` SDK. OpenRouter runs the batch on one upstream provider, the
cheapest eligible one unless `provider_only` pins some. `GET /batches/{id}` reports progress
and, once the batch has ended, holds every result: a response or an error per request.

OpenRouter keeps no metadata and takes no idempotency key on a batch, so a batch is found
after a crash the way anthropic-batch finds one (routes/anthropic/batch.py): `find` lists the
batches created in the dispatch's window with exactly its number of requests, and adopts one
only once it has ended and its results hold none but the dispatch's custom_ids; while a
candidate still runs it waits rather than guess. The create is sent with the SDK's retries
off, so it is never silently repeated.

Each request is checked before anything is stored (routes/openrouter/lines.py): an endpoint
OpenRouter does not batch, or an image or file sent inline (base64, `data:`), which
OpenRouter refuses on every provider, is refused naming the field.

The raw body of `GET /batches/{id}` is read for results, not the SDK's typed object: its
models drop the keys they do not declare, and an answer is kept whole (DESIGN invariant 8).

Not sent: `callback_url` (lowtide polls; the SDK writes it after `requests`, where OpenRouter's
docs say it must come before). Cancel: the SDK has no cancel method; OpenRouter's API reference
has `POST /batches/{id}/cancel`, sent through the SDK's own HTTP client and key.

Options: `base_url` (default OpenRouter's, https://openrouter.ai/api/v1), `api_key_env`
(OPENROUTER_API_KEY), `max_requests` (≤ 5,000), `max_bytes` (≤ 200 MB), `provider_only` (the
upstream providers allowed, e.g. [google-vertex]), `allow_fallbacks`, `poll_interval`
([first, longest] seconds, default [30, 600]), `find_window` (600 s), `timeout` (120 s).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Collection, Iterable
from datetime import UTC, datetime
from typing import Any, Literal

import httpx
import openrouter
from openrouter import errors, utils
from openrouter.types import UNSET

from lowtide.core import fastjson
from lowtide.core.cards import CARDS
from lowtide.core.endpoints import MESSAGES
from lowtide.core.errors import BatchGone, BatchRejected, NotSent, RouteError
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.anthropic.wire import anthropic_outcome
from lowtide.routes.base import BatchStatus
from lowtide.routes.openai.wire import openai_outcome
from lowtide.routes.openrouter.lines import refusal
from lowtide.routes.options import flag_option, number_option, secret_of, text_option, texts_option
from lowtide.routes.provider import (
    RETRYABLE_CODES,
    api_key,
    batch_limits,
    check_options,
    never_sent,
    poll_interval,
    retryable_status,
)
from lowtide.routes.wire import text_or_none

log = logging.getLogger(__name__)
NAME = "openrouter-batch"
CARD = CARDS[NAME]
TERMINAL = CARD.ended_states()
OPTIONS = {"base_url", "api_key_env", "max_requests", "max_bytes", "provider_only", "allow_fallbacks", "poll_interval",
           "find_window", "timeout"}  # fmt: skip
NO_RETRIES = utils.RetryConfig("none", utils.BackoffStrategy(0, 0, 0, 0), False)
# The SDK's own default retries a 5XX poll with backoff for up to an hour, which would hold a
# tick that long; the engine polls again on its own schedule, so a call gives up in 30 s.
RETRIES = utils.RetryConfig("backoff", utils.BackoffStrategy(500, 8_000, 1.5, 30_000), True)


class _RawBodies:
    """An SDK hook (Speakeasy's after-success hook, registered per client) keeping the raw
    body of each `GET /batches/{id}`, by batch id, until the route takes it."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {}

    def after_success(self, hook_ctx: Any, response: httpx.Response) -> httpx.Response:
        if hook_ctx.operation_id == "getBatches":
            self.bodies[response.request.url.path.rstrip("/").rsplit("/", 1)[-1]] = response.content
        return response


def parse_result(result: dict[str, Any], endpoint: str) -> Outcome:
    """One entry of a batch's `results` as an Outcome: a response, or an error."""
    cid = result["custom_id"]
    if not isinstance(cid, str):
        raise TypeError(f"custom_id is {type(cid).__name__}, not text")
    response = result.get("response")
    if isinstance(response, dict) and response.get("status_code", 500) < 400:
        body = response["body"]
        return (
            anthropic_outcome(cid, body, batch=True)
            if endpoint == MESSAGES
            else openai_outcome(cid, endpoint, body, batch=True)
        )
    if isinstance(response, dict):  # an HTTP error for this request alone
        status = response.get("status_code", 500)
        error = (response.get("body") or {}).get("error") or {}
        code = text_or_none(error.get("code") or error.get("type")) or f"http_{status}"
        message = text_or_none(error.get("message")) or f"HTTP {status}"
        return Outcome.failure(cid, code, f"HTTP {status}: {message}", retryable_status(status))
    error = result.get("error") or {}
    code = (
        text_or_none(error.get("error_type") or error.get("type") or error.get("code"))
        or "unknown_error"
    )
    return Outcome.failure(
        cid, code, text_or_none(error.get("message")) or code, code in RETRYABLE_CODES
    )


class OpenRouterBatchRoute:
    kind: Literal["batch"] = "batch"
    name = NAME
    group_by_prefix = True

    def __init__(self, options: dict[str, Any]):
        check_options(self.name, options, OPTIONS)
        self.limits = batch_limits(self.name, options)
        base_url = text_option(self.name, options, "base_url")
        self.poll_interval = poll_interval(options, (30.0, 600.0))
        self.find_window = number_option(self.name, options, "find_window", 600, float)
        only = texts_option(self.name, options, "provider_only")
        fallbacks = (
            flag_option(self.name, options, "allow_fallbacks", True)
            if "allow_fallbacks" in options
            else None
        )
        self.provider = {
            k: v
            for k, v in (("only", only or None), ("allow_fallbacks", fallbacks))
            if v is not None
        } or None
        key = api_key(self.name, options, "OPENROUTER_API_KEY")
        self.secret = secret_of(key)  # scrubbed from the errors the engine keeps (routes/base.py)
        self._auth = {"Authorization": f"Bearer {key}"}  # for cancel, as the SDK sends it
        self.client = openrouter.OpenRouter(
            api_key=key, server_url=base_url, retry_config=RETRIES,
            # Per call: a stalled download gives up and the next poll resumes.
            timeout_ms=int(number_option(self.name, options, "timeout", 120, float, 1e-3) * 1000),
        )  # fmt: skip
        self._raw = _RawBodies()
        self.client.sdk_configuration.__dict__["_hooks"].register_after_success_hook(self._raw)

    def check_model(self, model: str) -> None:
        """OpenRouter says which models have a batch provider; another fails the batch at validation."""

    def refusal(self, request: Request) -> Refusal | None:
        return refusal(request, CARD)

    async def submit(self, key: str, requests: Iterable[Request]) -> str:
        # The SDK sends one JSON body, so the batch is built whole (≤ 5,000 requests, 200 MB).
        models, endpoints, entries = set(), set(), []
        for r in requests:
            models.add(r.model)
            endpoints.add(r.endpoint)
            entries.append({"custom_id": r.custom_id, "body": r.body})
        if len(models) != 1 or len(endpoints) != 1:  # sending it again cannot help: permanent
            raise BatchRejected(
                f"{self.name}: one model and one endpoint per batch, got {sorted(models)} and {sorted(endpoints)}"
            )
        try:
            batch = await self.client.batch.create_batches_async(
                model=models.pop(), endpoint=endpoints.pop(), requests=entries,  # type: ignore[arg-type]
                provider=self.provider if self.provider else UNSET, retries=NO_RETRIES,
            )  # fmt: skip
        except errors.OpenRouterError as err:
            message = f"{self.name}: HTTP {err.status_code}: {_message(err)}"
            if err.status_code in (400, 401, 402, 403, 404, 413, 422):
                raise BatchRejected(message) from None
            raise RouteError(message) from None
        except httpx.TransportError as err:
            if never_sent(err):  # no connection, so no batch: nothing to find after this
                raise NotSent(
                    f"{self.name}: could not connect to {self.client.sdk_configuration.get_server_details()[0]}: {err}"
                ) from None
            raise
        return batch.id

    async def find(
        self,
        key: str,
        size: int,
        not_before: float,
        known: Collection[str] = (),
        sent: Collection[str] | None = None,
    ) -> str | None:
        """This dispatch's batch, proven by its results holding only `sent` (the custom_ids its
        create carried); None only when no batch in the window can be it."""
        found = [b async for b in self._candidates(size, not_before, known)]
        # Without `sent` nothing can be proven ours: every candidate is waited on as if running.
        running = [b.id for b in found if b.status not in TERMINAL or sent is None]
        ids = set(sent or ())
        ours = [b.id for b in found if b.id not in running and await self._holds_only(b.id, ids)]
        if len(ours) > 1:
            raise RouteError(
                f"{self.name}: {len(ours)} batches ({', '.join(ours)}) match a dispatch of {size} requests created in the same "
                "window; refusing to guess. Delete the extra one at OpenRouter, then run `lowtide tick` again"
            )
        if not ours and running:
            raise RouteError(
                f"{self.name}: waiting: batch {', '.join(running)} of {size} requests was created in this dispatch's window "
                "and may be another client's; OpenRouter keeps no metadata on a batch and shows its results only once it "
                "has ended, so it is neither adopted nor sent again before then"
            )
        return ours[0] if ours else None

    async def _candidates(
        self, size: int, not_before: float, known: Collection[str]
    ) -> AsyncIterator[Any]:
        """Batches of `size` requests created in the window, other than those in `known`."""
        since = datetime.fromtimestamp(not_before - 60, UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )  # as OpenRouter's reference writes one
        page = await self.client.batch.list_async(limit=100, created_after=since)
        while page is not None:
            for batch in page.result.data:
                created = batch.created_at
                if created < not_before - 60:  # newest first: everything further is older
                    return
                if (
                    batch.id not in known
                    and created <= not_before + self.find_window
                    and batch.request_counts.total == size
                ):
                    yield batch
            page = await page.next() if page.next is not None else None

    async def _holds_only(self, batch_id: str, ours: set[str]) -> bool:
        """Whether an ended batch's results name no custom_id outside `ours`."""
        for result in (await self._batch(batch_id)).get("results") or []:
            custom_id = result.get("custom_id") if isinstance(result, dict) else None
            if isinstance(custom_id, str) and custom_id not in ours:
                return False
        return True

    async def poll(self, batch_id: str) -> BatchStatus:
        batch = await self._batch(batch_id)
        counts = batch.get("request_counts") or {}
        status = batch.get("status", "")
        errors_ = []
        if status == "failed":
            errors_ = [
                text_or_none((batch.get("error") or {}).get("message"))
                or "OpenRouter failed the batch without saying why"
            ]
        return BatchStatus(
            phase=status, ended=status in TERMINAL, counts=dict(counts), errors=errors_
        )

    async def results(self, batch_id: str) -> AsyncIterator[Outcome]:
        batch = await self._batch(batch_id)
        endpoint = batch.get("endpoint") or ""
        for result in batch.get("results") or []:
            try:
                outcome = parse_result(result, endpoint)
            except (
                KeyError,
                TypeError,
                AttributeError,
            ) as err:  # its request counts as missing: retried
                log.warning("%s: skipped an unreadable result (%s): %.200s", self.name, err, result)
                continue
            yield outcome

    async def _batch(self, batch_id: str) -> dict[str, Any]:
        """`GET /batches/{id}` as OpenRouter sent it: the SDK's typed object would drop what
        its models do not declare, and its models refuse an answer they do not know whole
        (a Messages answer without `container`), which is still read."""
        try:
            await self.client.batch.get_batches_async(id=batch_id)
        except (
            errors.ResponseValidationError
        ) as err:  # an answer shaped beyond the SDK's models: kept as sent
            if batch_id not in self._raw.bodies:
                raise RouteError(f"{self.name}: batch {batch_id}: {err.message}") from None
            log.debug(
                "%s: batch %s: read as sent; the SDK's models refused it: %.300s",
                self.name,
                batch_id,
                err,
            )
        except errors.OpenRouterError as err:
            if err.status_code in (404, 410):
                raise BatchGone(
                    f"{self.name}: HTTP {err.status_code} for batch {batch_id}: {_message(err)}"
                ) from None
            raise RouteError(
                f"{self.name}: HTTP {err.status_code} for batch {batch_id}: {_message(err)}"
            ) from None
        return fastjson.loads(self._raw.bodies.pop(batch_id))

    async def cancel(self, batch_id: str) -> None:
        config = self.client.sdk_configuration
        base, _ = config.get_server_details()
        response = await config.async_client.post(
            f"{base.rstrip('/')}/batches/{batch_id}/cancel",
            headers=self._auth,
            timeout=config.timeout_ms / 1000 if config.timeout_ms else None,
        )
        if response.status_code >= 400:
            raise RouteError(
                f"{self.name}: HTTP {response.status_code} cancelling batch {batch_id}: {response.text[:500]}"
            )

    async def aclose(self) -> None:
        await self.client.__aexit__(None, None, None)


def _message(err: errors.OpenRouterError) -> str:
    try:
        return str(json.loads(err.body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return err.message or err.body[:500]


def create(options: dict[str, Any]) -> OpenRouterBatchRoute:
    return OpenRouterBatchRoute(options)
