"""What the engine needs to know about one request before it can be scheduled: its prompt
tokens, the group of requests it can share a prefix with, its output budget, the tokenised
choices, and how many KV cells it will hold at most.

A request that cannot run (too long for the context) becomes a failed `Outcome` here,
before it takes a slot.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes._own import read_plain
from lowtide.routes.local.model import Model

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

    @property
    def key(self) -> tuple:
        """Requests calibrated together: same messages before the last, same choices."""
        return (self.group, tuple(self.request.choices or ()))

    def need(self, shared: int) -> int:
        """KV cells this job holds at most, beyond the first `shared` prompt tokens."""
        if self.candidates is not None:  # every choice but its last token, side by side
            return len(self.tokens) - shared + sum(len(c) - 1 for c in self.candidates)
        return len(self.tokens) - shared + self.budget

    def ending(self, model: Model, out: list[int], eog: bool) -> tuple[str, str | None]:
        """The text so far and why generation ends now ("stop", "length"), or None."""
        reason = "stop" if eog else None
        if not (self.stops or reason or len(out) >= self.budget):
            return "", None  # nothing to check: skip detokenising
        text = b"".join(model.piece(t) for t in out).decode("utf-8", "ignore")
        cut = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if cut:
            return text[: min(cut)], "stop"
        if reason is None and len(out) >= self.budget:
            reason = "length"
        return text, reason


def prepare(
    model: Model, request: Request, ticket: Ticket, window: int, seed: int, max_feed: int
) -> Job | Outcome:
    """Tokenise `request` into a `Job`, or a non-retryable failure if it cannot run.

    `window` is the most tokens one request may hold in the KV cache (prompt and output);
    `max_feed` the longest choice the engine can score in one step.
    """
    cid = request.custom_id
    plain = read_plain(request)
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
        if job.temperature > 0:
            job.rng = np.random.default_rng([seed, zlib.crc32(cid.encode())])
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
    return job


def _choice_tokens(model: Model, prompt: list[int], messages: list, choice: str) -> list[int]:
    """The tokens `choice` has when written right after the prompt.

    Tokenising prompt and answer together and keeping the tail respects merges across the
    boundary; if the prompt's own tokens change, tokenise the answer on its own.
    """
    joined = model.tokenize(model.render(messages) + choice)
    if joined[: len(prompt)] == prompt:
        return joined[len(prompt) :]
    return model.tokenize(choice, special=False)
