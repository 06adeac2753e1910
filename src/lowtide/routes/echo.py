"""`echo`: an instant, deterministic direct route for dry runs, tests and benchmarks.

It is not a model. Its answer is a documented function of the request:

- with `choices`: the first choice that appears (case-insensitive) in the last user message,
  else `choices[crc32(custom_id) % len(choices)]`;
- otherwise: the last user message, cut to the request's output limit × 4 characters.

It honours plain-text turns only (`_own.py`): anything else in a body is refused by name.

Usage is counted as characters / 4 (rounded up), input over all messages.

Options (for tests of retry paths): `fail_attempts: {custom_id: n}` makes the first n attempts
of that request fail with a retryable `server_error`; `reject: [custom_id, …]` fails those
requests permanently with `invalid_request`.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from lowtide.core.errors import RouteError
from lowtide.core.types import Outcome, Refusal, Request, Usage
from lowtide.routes._own import Plain, read_plain

KNOWN_OPTIONS = {"fail_attempts", "reject", "dispatch_size"}


def _tokens(text: str) -> int:
    return -(-len(text) // 4)


def answer(request: Request, plain: Plain) -> str:
    last_user = next((m["content"] for m in reversed(plain.messages) if m["role"] == "user"), "")
    if request.choices:
        lowered = last_user.lower()
        hits = [(at, c) for c in request.choices if (at := lowered.find(c.lower())) >= 0]
        if hits:
            return min(hits)[1]
        return request.choices[zlib.crc32(request.custom_id.encode()) % len(request.choices)]
    return last_user if plain.max_tokens is None else last_user[: plain.max_tokens * 4]


class EchoRoute:
    kind: Literal["direct"] = "direct"
    name = "echo"

    def __init__(self, options: dict[str, Any]):
        unknown = set(options) - KNOWN_OPTIONS
        if unknown:
            raise RouteError(f"echo: unknown route_options {sorted(unknown)}; known: {sorted(KNOWN_OPTIONS)}")
        self.fail_attempts: dict[str, int] = dict(options.get("fail_attempts") or {})
        self.reject = set(options.get("reject") or [])
        self.dispatch_size = int(options.get("dispatch_size", 5000))

    def check_model(self, model: str) -> None:
        """echo answers for any model name: it never calls one."""

    def refusal(self, request: Request) -> Refusal | None:
        plain = read_plain(request)
        return plain if isinstance(plain, Refusal) else None

    def outcome(self, request: Request) -> Outcome:
        if request.custom_id in self.reject:
            return Outcome.failure(request.custom_id, "invalid_request", "echo: rejected by route_options.reject", False)
        if request.attempt <= self.fail_attempts.get(request.custom_id, 0):
            return Outcome.failure(request.custom_id, "server_error", f"echo: injected failure on attempt {request.attempt}", True)
        plain = read_plain(request)
        if isinstance(plain, Refusal):
            return Outcome.failure(request.custom_id, "invalid_request", plain.message(self.name), False)
        text = answer(request, plain)
        usage = Usage(
            input_tokens=sum(_tokens(m["content"]) for m in plain.messages),
            output_tokens=_tokens(text),
        )
        return Outcome(request.custom_id, True, text=text, usage=usage, finish_reason="stop")

    async def execute(self, requests: Sequence[Request]) -> AsyncIterator[Outcome]:
        for request in requests:
            yield self.outcome(request)

    async def aclose(self) -> None:
        pass


def create(options: dict[str, Any]) -> EchoRoute:
    return EchoRoute(options)
