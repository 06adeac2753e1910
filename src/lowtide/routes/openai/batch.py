"""`openai-batch`: OpenAI's Batch API (or any server speaking it, like `lowtide serve`).

One provider batch per dispatch: the requests are written as a JSONL file of
`/v1/chat/completions` lines, uploaded, and a batch is created with the dispatch's key in its
metadata (`lowtide_key`). The create call is made with SDK retries off, so a create is never
silently repeated; after a crash `find` lists recent batches and adopts the one with the key.
Output and error files are streamed line by line.

Options: `base_url`, `api_key_env` (default OPENAI_API_KEY), `max_requests` (≤ 50,000),
`max_bytes` (≤ 200 MB), `poll_interval` ([first, longest] seconds, default [30, 600]),
`find_hours` (how far back `find` looks, default 48), `timeout` (seconds a connect, read or
write may stall, 120), `tier` (your OpenAI usage tier, 1..5: the batch queue limits that
apply, core/batch_limits.py) and `max_enqueued_tokens` (one number, or one per model with
`*` for the rest: wins over `tier`). With either, the engine plans batches so that the
input tokens enqueued per model stay within the limit; a batch the provider still fails
with `token_limit_exceeded` is sent again once in-flight batches ended (`queue_full`).
"""

from __future__ import annotations

import functools
import json
import logging
import tempfile
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any, Literal

import openai

from lowtide.core import fastjson
from lowtide.core.batch_limits import TIERS, enqueued_token_limit
from lowtide.core.cards import CARDS, Card
from lowtide.core.errors import BatchGone, BatchRejected, NotSent, ResultsGone, RouteError
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.base import BatchStatus, LazyClient
from lowtide.routes.openai.wire import openai_outcome, openai_refusal
from lowtide.routes.options import number_option, secret_of, text_option
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
ENDPOINT = "/v1/chat/completions"  # the default: a batch's endpoint is its requests' own
CARD = CARDS["openai-batch"]  # limits, states, how a batch is found (core/cards.py)
TERMINAL = CARD.ended_states()
OPTIONS = {"base_url", "api_key_env", "max_requests", "max_bytes", "poll_interval", "find_hours", "timeout",
           "tier", "max_enqueued_tokens"}  # fmt: skip
METADATA_KEY = CARD.recovery.field.removeprefix("metadata.")  # lowtide_key
QUEUE_FULL = "token_limit_exceeded"  # the validation error of a batch over the enqueued-token limit


@contextmanager
def jsonl_file(name: str, requests: Iterable[Request], line: Callable[[Request], dict[str, Any]], unit: str) -> Iterator[tuple[IO[bytes], str, str]]:
    """The requests as a JSONL file of `line(request)`, at its start, with their one model
    and endpoint; more than one of either is BatchRejected (sending it again cannot help:
    permanent, never retried). Spooled: small files stay in memory, big ones go to disk,
    never both whole."""
    models, endpoints = set(), set()
    with tempfile.SpooledTemporaryFile(max_size=16 * 2**20) as f:
        for r in requests:
            models.add(r.model)
            endpoints.add(r.endpoint)
            f.write(fastjson.dumpb(line(r)) + b"\n")
        if len(models) != 1:
            raise BatchRejected(f"{name}: one model per {unit}, got {sorted(models)}")
        if len(endpoints) != 1:
            raise BatchRejected(f"{name}: one endpoint per {unit}, got {sorted(endpoints)}")
        f.seek(0)
        yield f, models.pop(), endpoints.pop()


def request_line(request: Request) -> dict[str, Any]:
    """One input line of an OpenAI batch file."""
    return {"custom_id": request.custom_id, "method": "POST", "url": request.endpoint, "body": request.body}


def parse_result_line(line: dict[str, Any], endpoint: str = ENDPOINT) -> Outcome:
    """One line of an output or error file, as an Outcome (see batch-apis.md for the shapes).
    A line whose custom_id is not text names no request: TypeError (the line is skipped)."""
    cid = line["custom_id"]
    if not isinstance(cid, str):
        raise TypeError(f"custom_id is {type(cid).__name__}, not text")
    response = line.get("response")
    if response is not None and response.get("status_code", 500) < 400:
        return openai_outcome(cid, endpoint, response["body"], batch=True)
    if response is not None:
        status = response.get("status_code", 500)
        error = (response.get("body") or {}).get("error") or {}
        code = text_or_none(error.get("code") or error.get("type")) or f"http_{status}"
        message = text_or_none(error.get("message")) or f"HTTP {status}"
        return Outcome.failure(cid, code, f"HTTP {status}: {message}", retryable_status(status))
    error = line.get("error") or {}
    code = text_or_none(error.get("code")) or "unknown_error"
    return Outcome.failure(cid, code, text_or_none(error.get("message")) or code, code in RETRYABLE_CODES)


class OpenAIBatchRoute(LazyClient):
    kind: Literal["batch"] = "batch"
    name = "openai-batch"
    group_by_prefix = True  # requests sharing a prompt prefix go together: cache hits

    purpose = "batch"  # the upload's purpose; `wire` (a card's) says another provider's
    completion_window = "24h"
    send_metadata = True

    def __init__(self, options: dict[str, Any]):
        check_options(self.name, options, OPTIONS)
        self.tier, self.max_enqueued_tokens = _queue_options(self.name, options)
        self.setup(options, CARD, "OPENAI_API_KEY", text_option(self.name, options, "base_url"))

    def setup(self, options: dict[str, Any], card: Card, key_env: str, base_url: str | None,
              client_class: type[openai.AsyncOpenAI] = openai.AsyncOpenAI) -> None:
        """What every route speaking OpenAI's Batch API sets up from its options and its card:
        limits, polling, the key and the SDK client (routes/openai/compatible_batch.py)."""
        self.card = card
        self.terminal = card.ended_states()
        self.limits = batch_limits(card.name, options)
        self.poll_interval = poll_interval(options | {"base_url": base_url}, (30.0, 600.0))
        self.find_seconds = number_option(self.name, options, "find_hours", 48, float) * 3600
        key = api_key(self.name, options, key_env)
        self.secret = secret_of(key)  # scrubbed from the errors the engine keeps (routes/base.py)
        self.make_client = functools.partial(
            client_class,
            api_key=key,
            base_url=base_url,
            # Per read or write, not per call: a stalled download gives up and the next poll resumes.
            timeout=number_option(self.name, options, "timeout", 120, float, 1e-3),
        )

    def check_model(self, model: str) -> None:
        """The provider says which models it has; an unknown one fails the batch at validation."""

    def token_limit(self, model: str) -> int | None:
        """Input tokens of `model` that may be enqueued at once (None: no limit planned)."""
        return enqueued_token_limit(model, self.tier, self.max_enqueued_tokens)

    def refusal(self, request: Request) -> Refusal | None:
        return openai_refusal(request, self.name)

    async def submit(self, key: str, requests: Iterable[Request]) -> str:
        with jsonl_file(self.name, requests, request_line, "batch file") as (f, _model, endpoint):
            try:
                # a purpose or window the SDK's types do not list is sent as given
                uploaded = await self.client.files.create(file=(f"{key}.jsonl", f), purpose=self.purpose)  # type: ignore[arg-type]
                batch = await self.client.with_options(max_retries=0).batches.create(
                    input_file_id=uploaded.id,
                    endpoint=endpoint,
                    completion_window=self.completion_window,  # type: ignore[arg-type]
                    metadata={METADATA_KEY: key} if self.send_metadata else openai.omit,
                )
            except openai.APIStatusError as err:
                raise translate_create_error(self.name, err) from None
            except openai.APIConnectionError as err:
                if never_sent(err):  # no connection, so no batch: nothing to find after this
                    raise NotSent(f"{self.name}: could not connect to {self.client.base_url}: {err.__cause__ or err}") from None
                raise
        return batch.id

    async def find(
        self, key: str, size: int, not_before: float, known: Collection[str] = (), sent: Collection[str] | None = None
    ) -> str | None:
        oldest = not_before - 3600  # clocks differ; look a little further back
        async for batch in self.client.batches.list(limit=100):
            if (batch.metadata or {}).get(METADATA_KEY) == key:
                return batch.id
            if batch.created_at < min(oldest, not_before - self.find_seconds):
                break
        return None

    async def poll(self, batch_id: str) -> BatchStatus:
        try:
            batch = await self.client.batches.retrieve(batch_id)
        except openai.NotFoundError as err:
            raise BatchGone(f"{self.name}: HTTP 404 for batch {batch_id}: {err.message}") from None
        counts = batch.request_counts.model_dump() if batch.request_counts else {}
        errors = []
        queue_full = False
        if batch.status == "failed":
            data = batch.errors.data if batch.errors and batch.errors.data else []
            errors = [f"line {e.line}: {e.code}: {e.message}" if e.line else f"{e.code}: {e.message}" for e in data]
            errors = errors or ["the provider failed the batch without saying why"]
            queue_full = bool(data) and all(e.code == QUEUE_FULL for e in data)
        return BatchStatus(phase=batch.status, ended=batch.status in self.terminal, counts=counts, errors=errors, queue_full=queue_full)

    async def results(self, batch_id: str) -> AsyncIterator[Outcome]:
        batch = await self.client.batches.retrieve(batch_id)
        endpoint = batch.endpoint or ENDPOINT
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            try:
                async with self.client.files.with_streaming_response.content(file_id) as response:
                    async for text in response.iter_lines():
                        outcome = _parse(text, endpoint) if text.strip() else None
                        if outcome is not None:
                            yield outcome
            except openai.NotFoundError as err:  # the file was deleted there: not a download that broke off
                raise ResultsGone(f"{self.name}: HTTP 404 (not found) for file {file_id}, the results of batch {batch_id}: "
                                  f"{err.message}") from None  # fmt: skip

    async def cancel(self, batch_id: str) -> None:
        await self.client.batches.cancel(batch_id)

    async def aclose(self) -> None:
        if (client := self.made_client()) is not None:
            await client.close()


def _parse(text: str, endpoint: str = ENDPOINT) -> Outcome | None:
    """A corrupt line names no request we can trust: it is skipped (and logged), and the
    request it was for counts as missing from the output, so it is retried."""
    try:
        return parse_result_line(fastjson.loads(text), endpoint)
    except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as err:
        log.warning("openai-batch: skipped an unreadable result line (%s): %.200s", err, text)
        return None


def translate_create_error(route: str, err: openai.APIStatusError) -> RouteError:
    """A refusal that sending the same batch again cannot fix fails its requests; anything
    else is transient and the next tick finds-or-submits again."""
    message = f"{route}: HTTP {err.status_code}: {err.message}"
    if err.status_code in (400, 401, 403, 404, 413, 422):
        return BatchRejected(message)
    return RouteError(message)


def _queue_options(route: str, options: dict[str, Any]) -> tuple[int | None, int | dict[str, int] | None]:
    tier = options.get("tier")
    if tier is not None and (isinstance(tier, bool) or tier not in TIERS):
        raise RouteError(f"{route}: route_options.tier must be your OpenAI usage tier, one of 1, 2, 3, 4, 5; got {tier!r}")
    limit = options.get("max_enqueued_tokens")
    values = list(limit.values()) if isinstance(limit, dict) else [limit]
    if limit is not None and not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise RouteError(
            f"{route}: route_options.max_enqueued_tokens must be a positive whole number of tokens, or a mapping "
            f"of model to one (`*` for any other model); got {limit!r}"
        )
    return tier, limit


def create(options: dict[str, Any]) -> OpenAIBatchRoute:
    return OpenAIBatchRoute(options)
