"""What the engine needs to know about one request before it can be scheduled: its prompt
tokens, the group of requests it can share a prefix with, its output budget, the tokenised
choices, and how many KV cells it will hold at most.

A request that cannot run (too long for the context) becomes a failed `Outcome` here,
before it takes a slot. A request for `n` choices becomes n jobs (one per choice) that share
a `Gather`: its outcome is delivered once, when the last choice is in (or the first fails).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lowtide.core.types import Outcome, Refusal, Request, Usage
from lowtide.routes.own.local.honours import HONOURS, refusal
from lowtide.routes.own.local.model import Model
from lowtide.routes.own.local.schema import grammar_for
from lowtide.routes.own.plain import read_plain
from lowtide.routes.own.structure import json_ask
from lowtide.routes.replies import Reply, reply_body

Deliver = Callable[[Outcome], None]


@dataclass(eq=False)
class Ticket:
    """One `execute` call: where its outcomes go, and whether its caller has gone away."""

    deliver: Deliver
    cancelled: bool = False


@dataclass(eq=False)
class Job:
    request: Request
    ticket: Ticket
    tokens: list[int]  # the whole prompt, ending with the assistant header
    # The tokens of every message before the last (system prompt, example turns): requests
    # with the same `group` are run together and share the KV cells of their common prefix.
    group: tuple[int, ...]
    budget: int  # new tokens it may generate
    candidates: list[list[int]] | None = None  # tokenised `request.choices`
    rng: np.random.Generator | None = None
    stops: list[str] = field(default_factory=list)
    temperature: float = 0.0  # 0: greedy, the route's default when a body sets none
    top_p: float = 1.0
    gbnf: str | None = None  # the grammar the answer must match (a JSON Schema's)
    grammar: Any = None  # its llama.cpp sampler, made when the job takes a slot
    logprobs: int | None = None  # None: none asked; k: the chosen token's and the top k
    entries: list[dict[str, Any]] = field(default_factory=list)  # logprobs.content, so far
    index: int = 0  # which of the request's n choices
    gather: Gather | None = None

    @property
    def key(self) -> tuple:
        """Requests calibrated together: same messages before the last, same choices."""
        return (self.group, tuple(self.request.choices or ()))

    def need(self, shared: int) -> int:
        """KV cells this job holds at most, beyond the first `shared` prompt tokens."""
        if self.candidates is not None:  # every choice but its last token, side by side
            return len(self.tokens) - shared + sum(len(c) - 1 for c in self.candidates)
        return len(self.tokens) - shared + self.budget

    def ending(self, model: Model, out: list[int], eog: bool) -> Reply | None:
        """The reply if generation ends now (stop, stop_sequence, length), else None."""
        reason = "stop" if eog else None
        if not (self.stops or reason or len(out) >= self.budget):
            return None  # nothing to check: skip detokenising
        text = b"".join(model.piece(t) for t in out).decode("utf-8", "ignore")
        cut = [(i, s) for s in self.stops if (i := text.find(s)) >= 0]
        if cut:
            at, stop = min(cut)
            return Reply(text[:at], "stop_sequence", stop_sequence=stop, output_tokens=len(out),
                         logprobs=self._logprobs(len(text[:at].encode())))  # fmt: skip
        if reason is None and len(out) >= self.budget:
            reason = "length"
        if reason is None:
            return None
        return Reply(text, reason, output_tokens=len(out), logprobs=self._logprobs(None))

    def _logprobs(self, keep_bytes: int | None) -> list[dict[str, Any]] | None:
        """The entries of the tokens that made the reply (those past a stop string cut)."""
        if self.logprobs is None:
            return None
        if keep_bytes is None:
            return self.entries
        kept, seen = [], 0
        for entry in self.entries:
            if seen >= keep_bytes:
                break
            kept.append(entry)
            seen += len(entry["bytes"])
        return kept


@dataclass(eq=False)
class Gather:
    """The n choices of one request, delivered together as one outcome."""

    n: int
    replies: dict[int, Reply] = field(default_factory=dict)
    output_tokens: int = 0
    cached: int | None = None
    done: bool = False


def answered(request: Request, replies: list[Reply], usage: Usage) -> Outcome:
    """The outcome of a request answered by `replies` (one per choice), whole body included."""
    first = replies[0]
    finish = "stop" if first.finish == "stop_sequence" else first.finish
    return Outcome(request.custom_id, True, first.text, usage, finish,
                   response=reply_body(request, "local", replies, usage))  # fmt: skip


def finished(job: Job, reply: Reply, usage: Usage) -> Outcome | None:
    """The outcome to deliver now that `job` has its reply; None while choices are missing."""
    g = job.gather
    if g is None:
        return answered(job.request, [reply], usage)
    if g.done:
        return None
    g.replies[job.index] = reply
    g.output_tokens += usage.output_tokens
    g.cached = usage.cached_input_tokens if g.cached is None else min(g.cached, usage.cached_input_tokens)
    if len(g.replies) < g.n:
        return None
    g.done = True
    total = Usage(usage.input_tokens, g.cached, output_tokens=g.output_tokens)  # the prompt counts once
    return answered(job.request, [g.replies[i] for i in range(g.n)], total)


def failed(job: Job, outcome: Outcome) -> Outcome | None:
    """A failure of `job`, delivered once per request (the first failed choice)."""
    g = job.gather
    if g is not None:
        if g.done:
            return None
        g.done = True
    return outcome


def choices_of(job: Job, n: int, seed: int | None, route_seed: int) -> list[Job]:
    """`job` as the n jobs of its request's n choices, each with its own generator."""
    if n == 1:
        return [job]
    gather = Gather(n)
    jobs = []
    for i in range(n):
        rng = None if job.rng is None else _rng(route_seed, job.request.custom_id, seed, i)
        jobs.append(replace(job, index=i, gather=gather, rng=rng, entries=[]))
    return jobs


def _rng(route_seed: int, custom_id: str, seed: int | None, index: int) -> np.random.Generator:
    """A body's `seed` alone decides its draws (so the same prompt and seed repeat);
    without one, the route's seed and the custom_id do."""
    base = [seed % 2**64] if seed is not None else [route_seed, zlib.crc32(custom_id.encode())]
    return np.random.default_rng(base + [index] if index else base)


def prepare(
    model: Model, request: Request, ticket: Ticket, window: int, seed: int, max_feed: int
) -> list[Job] | Outcome:
    """Tokenise `request` into its jobs (one per choice asked), or a non-retryable failure
    if it cannot run.

    `window` is the most tokens one request may hold in the KV cache (prompt and output);
    `max_feed` the longest choice the engine can score in one step.
    """
    cid = request.custom_id
    refused = refusal(request)
    plain = read_plain(request, HONOURS) if refused is None else refused
    if isinstance(plain, Refusal):
        return Outcome.failure(cid, "invalid_request", plain.message("local"), False)
    messages = plain.messages
    try:
        full = model.tokenize(model.render(messages))
        group: list[int] = []
        if len(messages) > 1:
            head = model.tokenize(model.render(messages[:-1], add_assistant=False))
            if full[: len(head)] == head:
                group = head
    except UnicodeError as exc:
        return Outcome.failure(cid, "invalid_request", f"cannot encode the prompt: {exc}", False)
    except Exception as exc:  # the template, e.g. a role it does not know
        return Outcome.failure(cid, "invalid_request", f"cannot format the messages: {exc}", False)
    if not full:
        return Outcome.failure(cid, "invalid_request", "the prompt is empty", False)

    job = Job(request, ticket, full, tuple(group), budget=0, temperature=plain.temperature or 0.0)
    if request.choices:
        job.candidates = [_choice_tokens(model, full, messages, c) for c in request.choices]
        longest = max(len(c) for c in job.candidates)
        if longest == 0 or longest > max_feed:
            return Outcome.failure(
                cid, "invalid_request", f"each choice must be 1 to {max_feed} tokens long", False
            )
        over = job.need(0) - window
    else:
        # No limit asked: until the model stops or the context is full (none is invented).
        limit = window - len(full) if plain.max_tokens is None else plain.max_tokens
        job.budget = min(max(limit, 0), window - len(full))
        job.stops = [s for s in plain.stop if s]
        body_seed = request.body.get("seed")
        if job.temperature > 0:
            job.rng = _rng(seed, cid, body_seed, 0)
            job.top_p = float(request.body.get("top_p", 1.0))
        if request.body.get("logprobs") is True:
            job.logprobs = int(request.body.get("top_logprobs") or 0)
        ask = json_ask(request)
        if ask is not None:
            try:
                job.gbnf = grammar_for(ask.schema)
            except Exception as exc:
                message = f"{ask.field}: llama.cpp's JSON-schema grammar cannot take it: {exc}"
                return Outcome.failure(cid, "invalid_request", message, False)
        over = len(full) + 1 - window
    if over > 0:
        return Outcome.failure(
            cid,
            "context_length_exceeded",
            f"the prompt is {len(full)} tokens; with its answer it needs {over} more than the "
            f"{window}-token context of the local route. Shorten the prompt, or raise "
            "route_options.n_ctx (or lower route_options.slots)",
            False,
        )
    if job.candidates is not None:
        return [job]
    return choices_of(job, plain.n, request.body.get("seed"), seed)


def _choice_tokens(model: Model, prompt: list[int], messages: list, choice: str) -> list[int]:
    """The tokens `choice` has when written right after the prompt.

    Tokenising prompt and answer together and keeping the tail respects merges across the
    boundary; if the prompt's own tokens change, tokenise the answer on its own.
    """
    joined = model.tokenize(model.render(messages) + choice)
    if joined[: len(prompt)] == prompt:
        return joined[len(prompt) :]
    return model.tokenize(choice, special=False)
