"""`vertex-batch`: Gemini models on Vertex AI batch prediction, through the official
`google-genai` SDK with `vertexai=True` (Google's SDK for Gemini on Vertex; the
`google-cloud-aiplatform` generative module is deprecated).

One Vertex batch prediction job per dispatch, for one model. The requests are written as
one JSONL file of `{"request": GenerateContentRequest}` lines (lines.py: the custom_id rides
in each request's `labels`, which Vertex hands back with its answer) to
`{staging}/{key}/input.jsonl` in Cloud Storage, through the object-store layer (gcsfs;
spooled to disk past 16 MB, never held whole), and the job is created with
`batches.create(model, src=that file, config={"dest": "{staging}/{key}/output",
"display_name": key})`, the SDK's retries off. Vertex writes `predictions.jsonl` into a
folder of its own under `dest` (the job's `outputInfo.gcsOutputDirectory`); the route
copies each predictions file to a local spool and reads it line by line. A job that answered
(its `completionStats`) whose predictions are not there, or a file gone before it is copied,
was deleted in the bucket: `ResultsGone`, which the engine gives up after its grace
(engine/batches.py `_not_read`), not a download read again for ever.

Exactly-once: the job's display name is the dispatch's key; after a crash `find` lists jobs
filtered by that name (`display_name="KEY"`, checked again here) and adopts the one found.

States (the card's `status`): QUEUED, PENDING, RUNNING, PAUSED and UPDATING run;
CANCELLING is cancelling; SUCCEEDED and PARTIALLY_SUCCEEDED end with their lines read (a
request with none is treated as expired by the engine: retried, or sent to the fallback);
EXPIRED and CANCELLED likewise keep what was answered; FAILED fails the batch with
Vertex's error, unless some requests succeeded first, whose lines are then read as for an
expired job.

Options: `project`, `location`, `staging` (a gs:// prefix, required), `base_url` (another
server speaking Vertex, such as `lowtide serve`), `access_token_env`, `anonymous` (access.py),
`max_requests`, `max_bytes` (the card's or tighter), `poll_interval` ([first, longest]
seconds, default [60, 900]), `find_pages` (pages of 100 jobs `find` reads, 10), `timeout`
(seconds a call may take, 120), `models` (names to accept beyond the price catalog's Gemini
models).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Collection, Iterable
from typing import Any, Literal

from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from lowtide.core import fastjson
from lowtide.core.cards import CARDS
from lowtide.core.errors import (
    BatchGone,
    BatchRejected,
    NotSent,
    ResultsGone,
    RouteError,
    RouteUnavailableError,
)
from lowtide.core.locations import BLOCK, location, scheme_of, store_problem
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.base import BatchStatus
from lowtide.routes.gemini.batch import translate_error
from lowtide.routes.gemini.models import check_gemini_model
from lowtide.routes.options import number_option, secret_of, text_option, texts_option
from lowtide.routes.provider import batch_limits, check_options, never_sent, poll_interval
from lowtide.routes.vertex import lines
from lowtide.routes.vertex.access import access

log = logging.getLogger(__name__)
NAME = "vertex-batch"
CARD = CARDS[NAME]  # limits, states, how a job is found (core/cards.py)
TERMINAL = CARD.ended_states()
GOOGLE = "publishers/google/models/"
OPTIONS = {"project", "location", "staging", "base_url", "access_token_env", "anonymous", "max_requests", "max_bytes",
           "poll_interval", "find_pages", "timeout", "models"}  # fmt: skip
SPOOL = 16 * 2**20  # bytes of input held in memory before the spool goes to disk


def counts_of(job: types.BatchJob) -> dict[str, int]:
    stats = job.completion_stats
    if stats is None:
        return {}
    said = {"succeeded": stats.successful_count, "failed": stats.failed_count, "incomplete": stats.incomplete_count}
    return {k: int(v) for k, v in said.items() if v is not None}


def job_error(job: types.BatchJob) -> str:
    error = job.error
    if error is None or not error.message:
        return "Vertex AI failed the batch prediction job without saying why"
    return f"{error.code}: {error.message}" if error.code is not None else error.message


class VertexBatchRoute:
    kind: Literal["batch"] = "batch"
    name = NAME
    group_by_prefix = True  # requests sharing a prompt prefix go together

    def __init__(self, options: dict[str, Any]):
        check_options(self.name, options, OPTIONS)
        if importlib.util.find_spec("gcsfs") is None:  # said now, not on every submit
            raise RouteUnavailableError(f'route "{NAME}" needs the Python package "gcsfs", which is not installed; install it: '
                                        "pip install 'lowtide[vertex]'")  # fmt: skip
        self.card = CARD
        self.limits = batch_limits(self.name, options)
        staging = text_option(self.name, options, "staging")
        if staging is None or scheme_of(staging) != "gs":
            raise RouteError(f"{self.name}: route_options.staging must be a gs:// prefix (a bucket and folder where lowtide "
                             f"writes each job's input and Vertex AI its output), such as gs://my-bucket/lowtide; got {staging!r}")  # fmt: skip
        self.staging = staging.rstrip("/")
        self.poll_interval = poll_interval(options, (60.0, 900.0))
        self.find_pages = number_option(self.name, options, "find_pages", 10, int, 1)
        self.models = frozenset(texts_option(self.name, options, "models"))
        timeout = number_option(self.name, options, "timeout", 120, float, 1e-3)
        base_url = text_option(self.name, options, "base_url")
        self.access = access(self.name, options)  # refused here, before anything is stored
        self.secret = secret_of(self.access.token)  # scrubbed from the errors the engine keeps (routes/base.py)
        # Vertex's v1 API (the SDK's default is v1beta1): the version Google's batch
        # prediction reference documents, and the one `lowtide serve` speaks.
        http = types.HttpOptions(base_url=base_url, api_version="v1", timeout=int(timeout * 1000))
        self.client = genai.Client(vertexai=True, project=self.access.project, location=self.access.location,
                                   credentials=self.access.credentials, http_options=http)  # fmt: skip

    def check_model(self, model: str) -> None:
        name = model.removeprefix(GOOGLE).removeprefix("models/")
        if "/" in name:
            raise RouteError(f'{self.name}: "{model}" is not one of Google\'s Gemini models; vertex-batch runs '
                             f"publishers/google models (partner models on Vertex take OpenAI's line shape, not served here)")  # fmt: skip
        check_gemini_model(self.name, name, self.models)

    def refusal(self, request: Request) -> Refusal | None:
        return lines.refusal(request, self.name)

    async def submit(self, key: str, requests: Iterable[Request]) -> str:
        models: set[str] = set()
        source = f"{self.staging}/{key}/input.jsonl"
        with tempfile.SpooledTemporaryFile(max_size=SPOOL) as f:
            for r in requests:
                line = lines.request_line(r, self.name)
                if isinstance(line, Refusal):  # the loader refuses these; a store from before it did, here
                    raise BatchRejected(f"{self.name}: request {r.custom_id}: {line.message(self.name)}")
                models.add(r.model)
                f.write(fastjson.dumpb(line) + b"\n")
            if len(models) != 1:  # sending it again cannot help: permanent, never retried
                raise BatchRejected(f"{self.name}: one model per batch, got {sorted(models)}")
            f.seek(0)
            try:
                await asyncio.to_thread(_upload, f, source)
            except Exception as err:  # no job exists yet: nothing to find after this
                raise NotSent(f"{self.name}: {store_problem(source, err, 'write')}") from None
        config = {"dest": f"{self.staging}/{key}/output", "display_name": key,
                  "http_options": {"retry_options": {"attempts": 1}}}  # fmt: skip
        try:
            job = await self.client.aio.batches.create(model=models.pop(), src=source, config=config)
        except genai_errors.APIError as err:
            raise translate_error(self.name, err) from None
        except Exception as err:
            if never_sent(err):  # no connection, so no job
                raise NotSent(f"{self.name}: could not connect: {err}") from None
            raise
        if not job.name:
            raise RouteError(f"{self.name}: Vertex AI created a job without a name")
        return job.name

    async def find(
        self, key: str, size: int, not_before: float, known: Collection[str] = (), sent: Collection[str] | None = None
    ) -> str | None:
        config = {"page_size": 100, "filter": f'display_name="{key}"'}
        pager = await self.client.aio.batches.list(config=config)
        for page in range(self.find_pages):
            for job in pager.page:
                if job.display_name == key:  # the filter asked for it; not taken on trust
                    return job.name
            if page + 1 == self.find_pages or len(pager.page) < 100:
                return None
            try:
                await pager.next_page()
            except IndexError:  # no further page
                return None
        return None

    async def poll(self, batch_id: str) -> BatchStatus:
        try:
            job = await self.client.aio.batches.get(name=batch_id)
        except genai_errors.ClientError as err:
            if err.code == 404:
                raise BatchGone(f"{self.name}: HTTP 404 for batch prediction job {batch_id}: {err.message}") from None
            raise
        state = job.state.value if job.state else "JOB_STATE_UNSPECIFIED"
        counts = counts_of(job)
        if state == "JOB_STATE_FAILED" and not counts.get("succeeded"):
            return BatchStatus(phase=state, ended=True, counts=counts, errors=[job_error(job)])
        return BatchStatus(phase=state, ended=state in TERMINAL, counts=counts)

    async def results(self, batch_id: str) -> AsyncIterator[Outcome]:
        job = await self.client.aio.batches.get(name=batch_id)
        folder = job.output_info.gcs_output_directory if job.output_info else None
        if not folder:
            log.warning("%s: job %s (%s) names no output folder: its requests count as unanswered", NAME, batch_id, job.state)
            return
        paths = await asyncio.to_thread(_prediction_files, folder)
        answered = sum(counts_of(job).get(k, 0) for k in ("succeeded", "failed"))
        if not paths and answered:  # the job answered, and its predictions are not there: deleted, not a download that broke off
            raise ResultsGone(f"{self.name}: no predictions file in {folder} (not found), the output of batch prediction job "
                              f"{batch_id}, which answered {answered} request(s): deleted there")  # fmt: skip
        for path in paths:
            # To disk, then line by line: a big predictions file is never held in memory. In a
            # folder of its own: gcsfs removes a download it could not finish, and a spool file
            # removed under NamedTemporaryFile fails its close, hiding the download's own error.
            with tempfile.TemporaryDirectory() as spool_dir:
                spool = os.path.join(spool_dir, "predictions.jsonl")
                if not await asyncio.to_thread(_download, folder, path, spool):
                    raise ResultsGone(f"{self.name}: gs://{path} not found, the output of batch prediction job {batch_id}: "
                                      "deleted there since it was listed")  # fmt: skip
                with open(spool, encoding="utf-8", errors="replace") as f:
                    for text in f:
                        outcome = _parse(text) if text.strip() else None
                        if outcome is not None:
                            yield outcome

    async def cancel(self, batch_id: str) -> None:
        await self.client.aio.batches.cancel(name=batch_id)

    async def aclose(self) -> None:
        await self.client.aio.aclose()


def _upload(f: Any, url: str) -> None:
    loc = location(url)
    with loc.fs.open(loc.path, "wb") as out:
        shutil.copyfileobj(f, out, BLOCK)


def _prediction_files(folder: str) -> list[str]:
    """The predictions files Vertex wrote in the job's output folder (`predictions.jsonl`, or
    `predictions_0001.jsonl`, …), in order; none where its bucket is not there (deleted)."""
    loc = location(folder)
    with loc.errors():
        try:
            found = loc.fs.find(loc.path)
        except FileNotFoundError:  # gcsfs: no such bucket
            return []
    return sorted(p for p in found if p.rsplit("/", 1)[-1].startswith("predictions") and p.endswith(".jsonl"))


def _download(folder: str, path: str, local: str) -> bool:
    """Copy `path` to `local`; False where it is not there (deleted since it was listed)."""
    loc = location(folder)
    with loc.errors():
        try:
            loc.fs.get_file(path, local)
        except FileNotFoundError:
            return False
    return True


def _parse(text: str) -> Outcome | None:
    """A corrupt line names no request we can trust: it is skipped (and logged), and the
    request it was for counts as unanswered, so it is retried."""
    try:
        return lines.parse_output_line(fastjson.loads(text))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        log.warning("%s: skipped an unreadable predictions line (%s): %.200s", NAME, err, text)
        return None


def create(options: dict[str, Any]) -> VertexBatchRoute:
    return VertexBatchRoute(options)
