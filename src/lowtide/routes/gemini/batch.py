"""`gemini-batch`: Gemini's batch mode (or any server speaking it, like `lowtide serve`), on
the official `google-genai` SDK.

One provider batch per dispatch, for one model (the model is in the create call's path). A
chunk of up to `inline_bytes` (default 10 MB; Gemini takes inline batches under 20 MB) goes
inline; a bigger one is written as a JSONL file of `{"key": custom_id, "request": body}`
lines, uploaded with the SDK's resumable upload, and named as the batch's source. Either way
each body travels verbatim: the SDK's `http_options.extra_body` carries the requests as they
are, so nothing passes through the SDK's own request types (which would rename or refuse
keys it does not know). The model stays out of the request lines: it is the batch's.

Exactly-once: the batch's `displayName` is the dispatch's key, the create is made with the
SDK's retries off, and after a crash `find` lists recent batches and adopts the one named
so. Results are matched by `key` (file: its lines, streamed from a download to disk;
inline: each response's `metadata.key`). States are the SDK's `JOB_STATE_*`; a line of an
expired batch that says DEADLINE_EXCEEDED is `batch_expired` (`out_of_time`).

Reading a batch (poll, results, find) is a GET through the SDK's own HTTP client (its key,
base URL, timeout and errors) whose JSON is read as sent (operation.py), not
`batches.get`: that types every inline response on each call, keeps neither the
operation's `error` nor `batchStats`, and dumped back to camelCase it loses keys its types
lack and rewrites others (a `thoughtSignature` came back urlsafe-base64). A poll asks for a
partial response (Google's `fields` mask: the state and counts, not the responses).

Options: `base_url`, `api_key_env` (default GEMINI_API_KEY, then GOOGLE_API_KEY),
`max_requests` (≤ 100,000), `max_bytes` (≤ 2 GB), `inline_bytes`, `poll_interval`,
`find_pages` (pages of 100 batches `find` reads, default 10), `timeout` (seconds, 120),
`models` (model names to accept beyond the price catalog's Gemini models).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from typing import Any, Literal
from urllib.parse import urlencode

from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from lowtide.core import fastjson
from lowtide.core.cards import CARDS, check_limit
from lowtide.core.errors import BatchGone, BatchRejected, NotSent, ResultsGone, RouteError
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.base import BatchStatus, LazyClient
from lowtide.routes.gemini import operation as op
from lowtide.routes.gemini.models import check_gemini_model
from lowtide.routes.gemini.names import named_body
from lowtide.routes.gemini.wire import gemini_error, gemini_outcome
from lowtide.routes.options import number_option, secret_of, text_option, texts_option
from lowtide.routes.provider import (
    batch_limits,
    check_options,
    never_sent,
    not_a_variable,
    pasted_key,
    poll_interval,
)

log = logging.getLogger(__name__)
CARD = CARDS["gemini-batch"]  # limits, states (core/cards.py)
INLINE_BYTES = 10 * 2**20  # by default half of what Gemini takes inline (under 20 MB a batch)
TERMINAL = CARD.ended_states()
OPTIONS = {"base_url", "api_key_env", "max_requests", "max_bytes", "inline_bytes", "poll_interval", "find_pages",
           "timeout", "models"}  # fmt: skip


def gemini_key(options: dict[str, Any], route: str) -> str:
    names = [options["api_key_env"]] if options.get("api_key_env") else ["GEMINI_API_KEY", "GOOGLE_API_KEY"]
    for name in names:
        if isinstance(name, str) and os.environ.get(name):
            return os.environ[name]
    if not_a_variable(names[0]):
        raise RouteError(pasted_key(route))
    raise RouteError(f"{route}: no API key; set the {' or '.join(names)} environment variable")


def gemini_client(options: dict[str, Any], route: str) -> genai.Client:
    return gemini_client_maker(options, route)()


def gemini_client_maker(options: dict[str, Any], route: str) -> Callable[[], genai.Client]:
    """What makes the client: the options are read (and refused) now, the client made later."""
    http = types.HttpOptions(base_url=text_option("gemini-batch", options, "base_url"), api_version="v1beta", timeout=int(number_option("gemini-batch", options, "timeout", 120, float, 1e-3) * 1000))
    return functools.partial(genai.Client, api_key=gemini_key(options, route), http_options=http)


def request_line(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    """One line of a batch input file: the body without its model (the batch's)."""
    return {"key": request.custom_id, "request": {k: v for k, v in body.items() if k != "model"}}


def parse_result_line(line: dict[str, Any]) -> Outcome:
    """One line of a responses file: `{"key", "response"}` or `{"key", "error"}`. A line
    whose key is not text names no request: TypeError (the line is skipped)."""
    key = line["key"]
    if not isinstance(key, str):
        raise TypeError(f"key is {type(key).__name__}, not text")
    if isinstance(line.get("response"), dict):
        return gemini_outcome(key, line["response"], batch=True)
    return gemini_error(key, line.get("error"))


def translate_error(route: str, err: genai_errors.APIError) -> RouteError:
    """A refusal that sending the same batch again cannot fix fails its requests; anything
    else is transient and the next tick finds-or-submits again."""
    message = f"{route}: HTTP {err.code}: {err.message or err.status}"
    return BatchRejected(message) if err.code in (400, 401, 403, 404, 413) else RouteError(message)


class GeminiBatchRoute(LazyClient):
    kind: Literal["batch"] = "batch"
    name = "gemini-batch"
    group_by_prefix = True

    def __init__(self, options: dict[str, Any]):
        check_options(self.name, options, OPTIONS)
        self.limits = batch_limits(self.name, options)
        inline = number_option(self.name, options, "inline_bytes", INLINE_BYTES)
        self.inline_bytes = check_limit(self.name, "inline_bytes", inline, CARD.limits.inline_bytes, "bytes inline")
        self.poll_interval = poll_interval(options, (30.0, 600.0))
        self.find_pages = number_option(self.name, options, "find_pages", 10, int, 1)
        self.models = frozenset(texts_option(self.name, options, "models"))
        self.secret = secret_of(gemini_key(options, self.name))  # scrubbed from the errors the engine keeps (routes/base.py)
        self.make_client = gemini_client_maker(options, self.name)
        self.field_masks = True  # until the server refuses one

    def check_model(self, model: str) -> None:
        check_gemini_model(self.name, model, self.models)

    def refusal(self, request: Request) -> Refusal | None:
        body = named_body(request, self.name)
        return body if isinstance(body, Refusal) else None

    async def submit(self, key: str, requests: Iterable[Request]) -> str:
        models: set[str] = set()
        inline: list[dict[str, Any]] | None = []
        size = 0
        with tempfile.SpooledTemporaryFile(max_size=16 * 2**20) as f:
            for r in requests:
                body = named_body(r, self.name)
                if isinstance(body, Refusal):  # the loader refuses these; a store from before it did, here
                    raise BatchRejected(f"{self.name}: request {r.custom_id}: {body.message(self.name)}")
                models.add(r.model)
                line = request_line(r, body)
                data = fastjson.dumpb(line) + b"\n"
                size += len(data)
                if inline is not None and size <= self.inline_bytes:
                    inline.append({"request": line["request"], "metadata": {"key": r.custom_id}})
                    continue  # not written to the file too: an inline chunk is held once
                if inline is not None:  # too big to send inline: the file goes, with those before
                    for item in inline:
                        f.write(fastjson.dumpb({"key": item["metadata"]["key"], "request": item["request"]}) + b"\n")
                    inline = None
                f.write(data)
            if len(models) != 1:  # sending it again cannot help: permanent, never retried
                raise BatchRejected(f"{self.name}: one model per batch, got {sorted(models)}")
            model = models.pop()
            try:
                if inline is not None:
                    return await self._create(model, key, [], {"requests": {"requests": inline}})
                f.seek(0)
                uploaded = await self.client.aio.files.upload(file=f, config={"mime_type": "jsonl", "display_name": key})
                return await self._create(model, key, uploaded.name, None)
            except genai_errors.APIError as err:
                raise translate_error(self.name, err) from None
            except Exception as err:
                if never_sent(err):  # no connection, so no batch: nothing to find after this
                    raise NotSent(f"{self.name}: could not connect: {err}") from None
                raise

    async def _create(self, model: str, key: str, src: Any, inline: dict[str, Any] | None) -> str:
        # Inline requests ride in `extra_body`, verbatim; the SDK's own list stays empty.
        http = {"retry_options": {"attempts": 1}} | ({"extra_body": {"batch": {"inputConfig": inline}}} if inline else {})
        batch = await self.client.aio.batches.create(model=model, src=src, config={"display_name": key, "http_options": http})
        if not batch.name:
            raise RouteError(f"{self.name}: the provider created a batch without a name")
        return batch.name

    async def find(
        self, key: str, size: int, not_before: float, known: Collection[str] = (), sent: Collection[str] | None = None
    ) -> str | None:
        # Newest first, page by page (names only: a page of ended inline batches carries
        # every response otherwise), up to find_pages of them.
        token = None
        for _ in range(self.find_pages):
            query = {"pageSize": 100} | ({"pageToken": token} if token else {})
            page = await self._get(f"batches?{urlencode(query)}", op.FIND_FIELDS, has=op.has_names)
            for batch in page.get("operations") or ():
                if op.display_name_of(batch) == key:
                    return batch.get("name")
            token = page.get("nextPageToken")
            if not token:
                break
        return None

    async def poll(self, batch_id: str) -> BatchStatus:
        try:
            batch = await self._get(batch_name(batch_id), op.POLL_FIELDS, has=op.has_state)
        except genai_errors.ClientError as err:
            if err.code == 404:
                raise BatchGone(f"{self.name}: HTTP 404 for batch {batch_id}: {err.message}") from None
            raise
        state = op.state_of(batch)
        errors = [op.error_of(batch)] if state == "JOB_STATE_FAILED" else []
        return BatchStatus(phase=state, ended=state in TERMINAL, counts=op.counts_of(batch), errors=errors)

    async def results(self, batch_id: str) -> AsyncIterator[Outcome]:
        batch = await self._get(batch_name(batch_id), op.RESULTS_FIELDS, has=op.has_results)
        expired = op.state_of(batch) == "JOB_STATE_EXPIRED"
        output = op.output_of(batch)
        items = op.inline_responses(output)
        for i, item in enumerate(items):
            items[i] = None  # each response is let go once read: the batch is not held twice
            outcome = _inline(item)
            if outcome is not None:
                yield out_of_time(outcome) if expired else outcome
        name = op.responses_file(output)
        if name:
            # To disk, then line by line: a big responses file is never held in memory.
            with tempfile.NamedTemporaryFile(suffix=".jsonl") as spool:
                try:
                    await self.client.aio.files.download(file=name, destination=spool.name)
                except genai_errors.ClientError as err:
                    if err.code != 404:
                        raise
                    # The file was deleted there: not a download that broke off.
                    raise ResultsGone(f"{self.name}: HTTP 404 (not found) for file {name}, the results of batch "
                                      f"{batch_id}: {err.message}") from None  # fmt: skip
                with open(spool.name, encoding="utf-8", errors="replace") as lines:
                    for text in lines:
                        outcome = _parse(text) if text.strip() else None
                        if outcome is not None:
                            yield out_of_time(outcome) if expired else outcome

    async def _get(self, path: str, fields: str | None = None, has: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
        """GET `path` (under v1beta) through the SDK's own client (its key, base URL, timeout
        and errors), its JSON read as sent: `batches.get` would type every inline response.

        `fields` asks for a partial response. A server that refuses the mask (400), or whose
        masked answer lacks what `has` looks for where the whole answer has it, is asked
        again without one, and not asked with one again: a mask only ever saves work."""
        if fields is None or not self.field_masks:
            return await self._fetch(path)
        refused = False
        try:
            got = await self._fetch(f"{path}{'&' if '?' in path else '?'}{urlencode({'fields': fields})}")
            if has is None or has(got):
                return got
            why = "its answer left out what was asked for"
        except genai_errors.ClientError as err:
            if err.code != 400:
                raise
            refused, why = True, f"it refused the mask ({err.message})"
        whole = await self._fetch(path)
        if refused or has is None or has(whole):  # the mask was the trouble, not the batch
            self.field_masks = False
            log.warning("%s: asked for part of %s, %s; asking for whole batches from now on", self.name, path, why)
        return whole

    async def _fetch(self, path: str) -> dict[str, Any]:
        response = await self.client.aio._api_client.async_request("get", path, {}, None)
        return fastjson.loads(response.body) if response.body else {}

    async def cancel(self, batch_id: str) -> None:
        await self.client.aio.batches.cancel(name=batch_id)

    async def aclose(self) -> None:
        if (client := self.made_client()) is not None:
            await client.aio.aclose()


def _inline(item: Any) -> Outcome | None:
    """One inline response, `{"response" | "error", "metadata": {"key"}}`, as it came."""
    key = op.key_of(item)
    if not isinstance(key, str):
        log.warning("gemini-batch: skipped an inline response without a key: %.200s", item)
        return None
    if isinstance(item.get("response"), dict):
        return gemini_outcome(key, item["response"], batch=True)
    return gemini_error(key, item.get("error"))


def out_of_time(outcome: Outcome) -> Outcome:
    """A line of a batch that ended expired: one that says DEADLINE_EXCEEDED was not run
    before the batch ran out of time, `batch_expired` as OpenAI says it (the engine sends it
    to a fallback route at once, engine/fate.py OUT_OF_TIME), its words kept. In a batch that
    ran to its end the same status is the request's own timeout, and stays as it is."""
    if outcome.ok or outcome.error_code != "deadline_exceeded":
        return outcome
    outcome.error_code = "batch_expired"
    return outcome


def batch_name(batch_id: str) -> str:
    return batch_id if batch_id.startswith("batches/") else f"batches/{batch_id}"


def _parse(text: str) -> Outcome | None:
    """A corrupt line names no request we can trust: it is skipped (and logged), and the
    request it was for counts as missing from the output, so it is retried."""
    try:
        return parse_result_line(fastjson.loads(text))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        log.warning("gemini-batch: skipped an unreadable result line (%s): %.200s", err, text)
        return None


def create(options: dict[str, Any]) -> GeminiBatchRoute:
    return GeminiBatchRoute(options)
