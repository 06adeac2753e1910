"""The fault plan (`--faults FILE`): deterministic failures for testing clients.

    http:                              # answer some calls badly
      - match: "POST /v1/batches"      # METHOD PATH; `*` is one path segment or any method
        first: 2                       # which matching calls: first N | every N | calls [i, …]
        status: 429                    # answer with this error, in the provider's shape
        retry_after: 1                 # optional Retry-After header (seconds)
      - match: "GET /v1/files/*/content"
        every: 3
        delay: 5                       # wait 5 real seconds first (a client timeout)
      - match: "POST /v1/batches"
        first: 1
        status: 500
        after: true                    # run the call, then answer the error: a lost create
    batches:                           # do something to some batches, by creation order
      - api: openai                    # optional: only batches of this API
        first: 1
        fail_validation: {code: token_limit_exceeded, message: "Enqueued token limit reached"}
      - calls: [2]
        expire_after: 3                # run only 3 requests; the batch expires, the rest expired
      - every: 2
        drop_lines: 1                  # the first N result lines are left out,
        duplicate_lines: 1             # the next N are written twice,
        corrupt_lines: 1               # the next N are cut in half (not valid JSON)
    enqueued_tokens:                   # OpenAI's batch queue limit, per model (`*`: any other)
      gpt-4o-mini: 2000000             # a batch whose input tokens (request bodies' characters
      "*": 90000                       # / 4), with those of the model's batches in progress,
                                       # exceed it fails validation: token_limit_exceeded

Each rule counts the calls (or batches) it matches from 1, from server start; a rule
without first/every/calls fires on every match. For HTTP faults the first rule that fires
answers. Batch rules all apply (the first rule to set an action wins it), and what a batch
got is stored with it, so a restart does not change its fate. A program embedding the
server may swap the plan while it runs (`Faults.swap`; the counters start again).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lowtide.core.errors import SpecError
from lowtide.server.errors import DEFAULT_MESSAGES, ApiError, api_of

LINE_ACTIONS = ("drop_lines", "duplicate_lines", "corrupt_lines")


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    first: int | None = Field(None, ge=1)
    every: int | None = Field(None, ge=1)
    calls: list[int] | None = None

    @model_validator(mode="after")
    def _one_selector(self) -> _Rule:
        if sum(x is not None for x in (self.first, self.every, self.calls)) > 1:
            raise ValueError("give at most one of first, every, calls")
        return self

    def fires(self, n: int) -> bool:
        """Whether the n-th matching call (from 1) is hit."""
        if self.first is not None:
            return n <= self.first
        if self.every is not None:
            return n % self.every == 0
        if self.calls is not None:
            return n in self.calls
        return True


class HttpRule(_Rule):
    match: str = "*"
    status: int | None = Field(None, ge=400, le=599)
    delay: float | None = Field(None, ge=0)
    retry_after: float | None = Field(None, ge=0)
    message: str | None = None
    # Run the call first, then answer `status`: what it did stands (a batch created), and
    # the client hears only the error (a create whose answer was lost).
    after: bool = False

    @model_validator(mode="after")
    def _does_something(self) -> HttpRule:
        if self.status is None and self.delay is None:
            raise ValueError("give `status` (an error answer), `delay` (seconds), or both")
        if self.after and self.status is None:
            raise ValueError("`after: true` needs `status`: the error answered after the call ran")
        return self

    def matches(self, method: str, path: str) -> bool:
        if self.match.strip() == "*":
            return True
        want_method, _, want_path = self.match.strip().partition(" ")
        if want_method not in ("*", method.upper()):
            return False
        pattern = "^" + "/".join("[^/]+" if p == "*" else re.escape(p) for p in want_path.strip().split("/")) + "/?$"
        return re.match(pattern, path) is not None


class ValidationFault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    code: str = "failed_by_fault_plan"
    message: str = "This batch was failed at validation by the server's fault plan."


class BatchRule(_Rule):
    api: Literal["openai", "anthropic", "gemini"] | None = None
    fail_validation: ValidationFault | bool | None = None
    expire_after: int | None = Field(None, ge=0)
    drop_lines: int | None = Field(None, ge=1)
    duplicate_lines: int | None = Field(None, ge=1)
    corrupt_lines: int | None = Field(None, ge=1)

    def actions(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.fail_validation:
            fault = self.fail_validation if isinstance(self.fail_validation, ValidationFault) else ValidationFault()
            out["fail_validation"] = fault.model_dump()
        for key in ("expire_after", *LINE_ACTIONS):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class FaultPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    http: list[HttpRule] = Field(default_factory=list)
    batches: list[BatchRule] = Field(default_factory=list)
    enqueued_tokens: dict[str, Annotated[int, Field(gt=0)]] = Field(default_factory=dict)

    def token_limit(self, model: str) -> int | None:
        return self.enqueued_tokens.get(model, self.enqueued_tokens.get("*"))

    @classmethod
    def load(cls, path: Path) -> FaultPlan:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except OSError as err:
            raise SpecError(f"{path}: cannot read the fault plan ({err.strerror or err})") from None
        except yaml.YAMLError as err:
            raise SpecError(f"{path}: not valid YAML ({err})") from None
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            problems = [f"{path}: `{'.'.join(map(str, e['loc'])) or '(top level)'}`: {e['msg']}" for e in err.errors()]
            raise SpecError.from_problems(f"{path}: invalid fault plan", problems) from None


class Faults:
    """The plan with its counters. Thread-safe: handlers run on several threads."""

    def __init__(self, plan: FaultPlan | None = None):
        self._lock = threading.Lock()
        self.swap(plan or FaultPlan())

    def swap(self, plan: FaultPlan) -> None:
        """Serve by `plan` from the next call and the next batch on, counting from 1 again.
        Batches created before keep the actions they got."""
        with self._lock:
            self.plan = plan
            self._http = [0] * len(plan.http)
            self._batches = [0] * len(plan.batches)

    def for_call(self, method: str, path: str) -> HttpRule | None:
        hit = None
        with self._lock:
            for i, rule in enumerate(self.plan.http):
                if rule.matches(method, path):
                    self._http[i] += 1
                    if hit is None and rule.fires(self._http[i]):
                        hit = rule
        return hit

    def for_batch(self, api: str) -> dict[str, Any]:
        actions: dict[str, Any] = {}
        with self._lock:
            for i, rule in enumerate(self.plan.batches):
                if rule.api in (None, api):
                    self._batches[i] += 1
                    if rule.fires(self._batches[i]):
                        actions = rule.actions() | actions
        return actions


def apply_line_faults(lines: Iterator[tuple[str, Any]], actions: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Drop the first `drop_lines`, write the next `duplicate_lines` twice, cut the next
    `corrupt_lines` in half. Lines travel with a tag (which file they go to)."""
    for line, tag, _ in line_fates(lines, actions):
        yield line, tag


def line_fates(lines: Iterator[tuple[str, Any]], actions: dict[str, Any]) -> Iterator[tuple[str, Any, str]]:
    """`apply_line_faults`, each line written with its fate: whole, or corrupt (cut)."""
    drop, dup, corrupt = (int(actions.get(k) or 0) for k in LINE_ACTIONS)
    if drop == dup == corrupt == 0:  # the usual batch: its lines as they come
        for line, tag in lines:
            yield line, tag, "whole"
        return
    for n, (line, tag) in enumerate(lines):
        if n < drop:
            continue
        if n < drop + dup:
            yield line, tag, "whole"
            yield line, tag, "whole"
        elif n < drop + dup + corrupt:
            yield line[: len(line) // 2], tag, "corrupt"
        else:
            yield line, tag, "whole"


def install(app: FastAPI, faults: Faults, swappable: bool = False) -> None:
    """Answer planned HTTP faults before the real handler runs (or, `after`, once it ran).
    Without http rules nothing is installed, unless the plan may be `swappable` later."""
    if not faults.plan.http and not swappable:
        return

    @app.middleware("http")
    async def _faults(request: Request, call_next):
        rule = faults.for_call(request.method, request.url.path)
        if rule is None:
            return await call_next(request)
        if rule.delay:
            await asyncio.sleep(rule.delay)
        if rule.status is None:
            return await call_next(request)
        if rule.after:
            done = await call_next(request)
            async for _ in done.body_iterator:  # the handler ran to its end; its answer is lost
                pass
        headers = {"retry-after": f"{rule.retry_after:g}"} if rule.retry_after is not None else None
        message = rule.message or DEFAULT_MESSAGES.get(rule.status, f"Injected error {rule.status} (fault plan)")
        return ApiError(rule.status, message, headers=headers).response(api_of(request.url.path))
