"""`openai-compatible-batch`: OpenAI's Files + Batches API at another provider, by profile.

The openai-batch route's code (routes/openai/batch.py), pointed by `route_options.profile`
at one provider: its card (core/cards.py, `openai-compatible-batch:PROFILE`) gives the base
URL, the key's environment variable, the upload's `purpose`, the completion window, the
limits a batch is planned within and the discount it bills at. What differs between them:

| profile | base_url | key | purpose | endpoints |
|---|---|---|---|---|
| groq | https://api.groq.com/openai/v1 | GROQ_API_KEY | batch | chat |
| together | https://api.together.xyz/v1 | TOGETHER_API_KEY | batch-api | chat |
| novita | route_options.base_url (not confirmed here) | NOVITA_API_KEY | batch | chat, completions |
| doubleword | https://api.doubleword.ai/v1 | DOUBLEWORD_API_KEY | batch | chat, embeddings |

Answers are read as JSON, not as the SDK's `Batch`, because they differ: Together's create
answers `{"job": {…}}`, its batch has an upper-case `status`, a `progress` percentage and an
`error` text in place of `request_counts` and `errors`, ISO times, and its list is a bare
array (together-python types/batch.py, resources/batch.py). One reader takes both shapes.
No profile documents an idempotency key for create (DigitalOcean's `request_id` is the only
one seen, and DigitalOcean has its own route, digitalocean-batch), so a batch is found after
a crash by its metadata, where the provider keeps it.

Without a profile it is any server speaking OpenAI's Batch API at `route_options.base_url`.
`base_url` and `api_key_env` override the profile's; `max_requests` and `max_bytes` may
tighten its limits, never loosen them. Other options as openai-batch's: `poll_interval`,
`find_hours`, `timeout`. The official `openai` SDK is the client (Groq and Together document
their batch APIs as OpenAI-compatible).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any

import openai

from lowtide.core.cards import CARDS, profiles_of
from lowtide.core.errors import BatchGone, NotSent, RouteError
from lowtide.core.types import Refusal, Request
from lowtide.routes.base import BatchStatus
from lowtide.routes.openai.batch import (
    METADATA_KEY,
    QUEUE_FULL,
    OpenAIBatchRoute,
    jsonl_file,
    request_line,
    translate_create_error,
)
from lowtide.routes.openai.wire import openai_refusal
from lowtide.routes.options import text_option
from lowtide.routes.provider import check_options, never_sent

NAME = "openai-compatible-batch"
OPTIONS = {"profile", "base_url", "api_key_env", "max_requests", "max_bytes", "poll_interval", "find_hours", "timeout"}


def profile_card(route: str, options: dict[str, Any]):
    """The card `route_options.profile` names, or the route's own without one; an unknown
    profile lists the known ones."""
    profile = options.get("profile")
    if profile is None:
        return CARDS[route]
    known = profiles_of(route)
    if profile not in known:
        raise RouteError(f"{route}: unknown route_options.profile {profile!r}; known: {', '.join(known)}")
    return CARDS[f"{route}:{profile}"]


class OpenAICompatibleBatchRoute(OpenAIBatchRoute):
    name = NAME

    def __init__(self, options: dict[str, Any]):
        check_options(self.name, options, OPTIONS)
        card = profile_card(self.name, options)
        wire = card.wire
        assert wire is not None, card.name
        base_url = text_option(self.name, options, "base_url", wire.base_url)
        if base_url is None:
            who = f"{card.provider}'s OpenAI-compatible base URL" if "profile" in options else "the server's base URL"
            raise RouteError(f"{self.name}: no base_url: give route_options.base_url ({who}, ending in /v1)")
        self.tier, self.max_enqueued_tokens = None, None  # OpenAI's usage tiers: not this provider's
        self.purpose = wire.purpose
        self.completion_window = wire.completion_window
        self.send_metadata = wire.metadata
        self.setup(options, card, wire.key_env, base_url)

    def refusal(self, request: Request) -> Refusal | None:
        refused = openai_refusal(request, self.name)
        if refused is None and request.endpoint not in self.card.endpoints:
            endpoints = ", ".join(self.card.endpoints)
            return Refusal("endpoint", f"{self.card.provider} takes {endpoints} in a batch ({self.card.name}), "
                                       f"not {request.endpoint}; use another route for this endpoint")  # fmt: skip
        return refused


    async def submit(self, key: str, requests: Iterable[Request]) -> str:
        with jsonl_file(self.name, requests, request_line, "batch file") as (f, _model, endpoint):
            try:
                # a purpose or window the SDK's types do not list is sent as given
                uploaded = await self.client.files.create(file=(f"{key}.jsonl", f), purpose=self.purpose)  # type: ignore[arg-type]
                raw = await self.client.with_options(max_retries=0).batches.with_raw_response.create(
                    input_file_id=uploaded.id,
                    endpoint=endpoint,
                    completion_window=self.completion_window,  # type: ignore[arg-type]
                    metadata={METADATA_KEY: key} if self.send_metadata else openai.omit,
                )
            except openai.APIStatusError as err:
                raise translate_create_error(self.name, err) from None
            except openai.APIConnectionError as err:
                if never_sent(err):
                    raise NotSent(f"{self.name}: could not connect to {self.client.base_url}: {err.__cause__ or err}") from None
                raise
        body = raw.http_response.json()
        return str(job_of(body)["id"])

    async def find(
        self, key: str, size: int, not_before: float, known: Collection[str] = (), sent: Collection[str] | None = None
    ) -> str | None:
        oldest = min(not_before - 3600, not_before - self.find_seconds)  # clocks differ; look a little further back
        after: str | None = None
        while True:
            raw = await self.client.batches.with_raw_response.list(limit=100, **({"after": after} if after else {}))
            body = raw.http_response.json()
            page = body if isinstance(body, list) else body.get("data") or []
            for batch in page:
                if (batch.get("metadata") or {}).get(METADATA_KEY) == key:
                    return str(batch["id"])
                if seconds_of(batch.get("created_at")) < oldest:
                    return None
            if isinstance(body, list) or not body.get("has_more") or not page:
                return None
            after = body.get("last_id") or page[-1]["id"]

    async def poll(self, batch_id: str) -> BatchStatus:
        try:
            raw = await self.client.batches.with_raw_response.retrieve(batch_id)
        except openai.NotFoundError as err:
            raise BatchGone(f"{self.name}: HTTP 404 for batch {batch_id}: {err.message}") from None
        return batch_status(job_of(raw.http_response.json()), self.terminal, self.card.status)


def job_of(body: dict[str, Any]) -> dict[str, Any]:
    """The batch in an answer: Together's create wraps it as `{"job": …}`."""
    job = body.get("job")
    return job if isinstance(job, dict) else body


def seconds_of(value: Any) -> float:
    """A batch's time: Unix seconds (OpenAI), or ISO 8601 text (Together); 0 when neither."""
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return 0.0
    return 0.0


def batch_status(batch: dict[str, Any], terminal: frozenset[str], meanings: dict[str, str]) -> BatchStatus:
    """A polled batch in either shape: OpenAI's `request_counts` and `errors.data`, or
    Together's `progress` (a percentage) and `error` text."""
    phase = str(batch.get("status"))
    counts = batch.get("request_counts")
    if not isinstance(counts, dict):
        progress = batch.get("progress")
        counts = {"progress_percent": round(progress)} if isinstance(progress, int | float) else {}
    errors: list[str] = []
    queue_full = False
    if meanings.get(phase) == "failed":
        data = (batch.get("errors") or {}).get("data") or [] if isinstance(batch.get("errors"), dict) else []
        errors = [f"line {e['line']}: {e.get('code')}: {e.get('message')}" if e.get("line") else f"{e.get('code')}: {e.get('message')}"
                  for e in data]  # fmt: skip
        if isinstance(batch.get("error"), str) and batch["error"]:
            errors.append(batch["error"])
        errors = errors or ["the provider failed the batch without saying why"]
        queue_full = bool(data) and all(e.get("code") == QUEUE_FULL for e in data)
    return BatchStatus(phase=phase, ended=phase in terminal, counts={k: v for k, v in counts.items() if isinstance(v, int)},
                       errors=errors, queue_full=queue_full)  # fmt: skip


def create(options: dict[str, Any]) -> OpenAICompatibleBatchRoute:
    return OpenAICompatibleBatchRoute(options)
