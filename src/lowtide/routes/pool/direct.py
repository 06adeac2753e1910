"""What the real-time routes share: a pool that keeps requests in flight, retries in the
route, rate limits, and SDK errors turned into outcomes at the edge.

A route built on `PooledRoute` only says how one request is sent (`send`: return an
`Outcome`, or raise `CallFailed`). The pool does the rest, for the whole `execute` call:

- a fixed set of worker coroutines pulls requests from the list, each with at most one in
  flight; there are as many workers as the controller's `limit` (grown and shrunk as it
  moves, see `adaptive.py`), not one task per request;
- before each send a worker waits out a Retry-After pause (global to the route) and the
  `rpm` / `tpm` token buckets (`ratelimit.py`);
- a retryable failure (429, 408, 409, 5xx, timeout, dropped connection) is sent again up to
  `max_retries` times, after the Retry-After the server asked for, or else after an
  exponential backoff with jitter; then it becomes a retryable `Outcome`, and the engine's
  retry policy takes over. Anything else becomes a non-retryable `Outcome` at once;
- outcomes are yielded in the order they finish.

The API key never appears in an outcome: messages are scrubbed of it.
"""

from __future__ import annotations

import asyncio
import email.utils
import importlib
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Literal

from lowtide.core.endpoints import conversation_key
from lowtide.core.errors import RouteError
from lowtide.core.types import Outcome, Request
from lowtide.routes.options import flag_option, number_option, scrub, secret_of
from lowtide.routes.pool.adaptive import Controller
from lowtide.routes.pool.ratelimit import Pacer
from lowtide.routes.provider import retryable_status

POOL_OPTIONS = {
    "concurrency", "min_concurrency", "max_concurrency", "adaptive", "rpm", "tpm", "timeout",
    "max_retries", "retry_backoff", "dispatch_size", "expected_latency",
}  # fmt: skip
DEFAULT_OUTPUT = 1024  # tokens a request that sets no output limit is paced as if it may use
MAX_PAUSE = 120.0  # seconds: a longer Retry-After is cut to this
# What the openai and anthropic SDKs send about themselves; no server needs it.
TELEMETRY_HEADERS = (
    "X-Stainless-Lang", "X-Stainless-Package-Version", "X-Stainless-OS", "X-Stainless-Arch",
    "X-Stainless-Runtime", "X-Stainless-Runtime-Version", "X-Stainless-Async",
)  # fmt: skip
PER_REQUEST_TELEMETRY = ("X-Stainless-Retry-Count", "X-Stainless-Read-Timeout", "X-Stainless-Timeout")
OVERLOAD_STATUSES = (429, 503, 529)

# lowtide's code for an HTTP error the provider gave no code for.
STATUS_CODES = {
    400: "invalid_request", 401: "authentication_error", 403: "permission_denied",
    404: "model_not_found", 408: "timeout", 409: "conflict", 413: "request_too_large",
    422: "invalid_request", 429: "rate_limit_exceeded", 503: "service_unavailable",
    529: "overloaded_error",
}  # fmt: skip


class CallFailed(Exception):
    """One call that brought no answer, as lowtide sees it. Raised by a route's `send`;
    the pool retries it or turns it into an `Outcome`. It never leaves the route."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool,
        overload: bool = False,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.overload = overload
        self.retry_after = retry_after


def http_failure(status: int, body: object, headers: Mapping[str, str], code_keys: tuple[str, ...]) -> CallFailed:
    """An HTTP error reply, from its status, its body (as the SDK decoded it: the provider's
    error object, or the whole body) and headers. The code is the first of `code_keys` the
    provider filled in with a word (a number, as some servers put there, does not count);
    the message is the provider's own."""
    error = body
    if isinstance(error, dict) and isinstance(error.get("error"), dict):
        error = error["error"]
    if isinstance(error, dict):
        code = next((error[k] for k in code_keys if isinstance(error.get(k), str) and error[k]), None)
        message = str(error.get("message") or error.get("detail") or error)[:2000]
    else:
        code, message = None, (str(body)[:2000] if body else "no message")
    if code is None or code.isdigit():
        code = STATUS_CODES.get(status, "server_error" if status >= 500 else f"http_{status}")
    hint = " (check the model name and route_options.base_url)" if status == 404 else ""
    return CallFailed(
        code,
        f"HTTP {status}: {message}{hint}",
        retryable=retryable_status(status),
        overload=status in OVERLOAD_STATUSES,
        retry_after=retry_after(headers) if retryable_status(status) else None,
    )


def connection_failure(err: Exception, timeout: float, timed_out: bool) -> CallFailed:
    """A call that got no HTTP reply: it timed out, or the connection failed or dropped.
    `timed_out` is what the SDK says; the root cause decides when there is one, because
    the SDKs' aiohttp transport reports any connection error (a dropped one too) as a timeout."""
    cause = _root_cause(err)
    if cause is not None:
        timed_out = isinstance(cause, TimeoutError)
    if timed_out:
        return CallFailed("timeout", f"no answer within {timeout:g} s (route_options.timeout)", retryable=True)
    detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(err)
    return CallFailed("connection_error", f"connection failed or dropped: {detail}", retryable=True)


def _root_cause(err: BaseException) -> BaseException | None:
    """The exception at the bottom of a chain of re-raises (None if `err` has no cause)."""
    cause, seen = None, 0
    while (nxt := (err.__cause__ or err.__context__)) is not None and seen < 20:
        cause = err = nxt
        seen += 1
    return cause


def http_library(client_class: type) -> ModuleType:
    """The HTTP library an SDK's default client is built on (`httpx`, or `httpx2` in newer
    SDKs), for its `Limits`."""
    base = next(c for c in client_class.__mro__[1:] if c.__name__ == "AsyncClient")
    return importlib.import_module(base.__module__.partition(".")[0])


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asked us to wait: `retry-after-ms`, or `retry-after` as seconds or
    an HTTP date. None when it did not ask."""
    try:
        if (ms := headers.get("retry-after-ms")) is not None:
            return max(0.0, float(ms) / 1000)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


class PooledRoute:
    """Base of the real-time routes. Subclasses set `name`, implement `send`, and may
    override `prepare` (runs once, before the first send)."""

    kind: Literal["direct"] = "direct"
    name = "direct"

    def __init__(
        self,
        options: dict[str, Any],
        *,
        concurrency: int,
        max_concurrency: int | None = None,
        timeout: float = 600.0,
        expected_latency: float = 10.0,
        secret: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        """The keyword arguments are the route's defaults; `options` (the job spec's
        route_options) override them. `secret` is scrubbed from every message."""
        n = self.name
        initial = number_option(n, options, "concurrency", concurrency, int, 1)
        maximum = number_option(n, options, "max_concurrency", max_concurrency or max(initial, 2 * initial), int, 1)
        minimum = number_option(n, options, "min_concurrency", 1, int, 1)
        if minimum > maximum:
            raise RouteError(f"{n}: route_options.min_concurrency ({minimum}) is above max_concurrency ({maximum})")
        self.controller = Controller(
            initial, minimum, max(maximum, initial), adaptive=flag_option(n, options, "adaptive", True), clock=clock
        )
        self.pacer = Pacer(
            number_option(n, options, "rpm", None, float, 1e-9), number_option(n, options, "tpm", None, float, 1e-9), clock, sleep
        )
        self.timeout = number_option(n, options, "timeout", timeout, float, 1e-3)
        self.max_retries = number_option(n, options, "max_retries", 3, int, 0)
        self.expected_latency = number_option(n, options, "expected_latency", expected_latency, float, 1e-6)
        self.dispatch_size = number_option(n, options, "dispatch_size", 2000, int, 1)
        backoff = options.get("retry_backoff", (0.5, 8.0))
        if not (isinstance(backoff, list | tuple) and len(backoff) == 2 and 0 <= backoff[0] <= backoff[1]):
            raise RouteError(f"{n}: route_options.retry_backoff must be [first, longest] seconds; got {backoff!r}")
        self.backoff = (float(backoff[0]), float(backoff[1]))
        self.clock = clock
        self.sleep = sleep
        self.secret = secret_of(secret)
        self.rng = random.Random()
        self._prepared = False

    # -- what a provider module supplies ----------------------------------------------------

    async def send(self, request: Request) -> Outcome:
        """One call for one request: its outcome, or `CallFailed`."""
        raise NotImplementedError

    def sdk_client(self, client_class: type, http_client_class: type, key: str, base_url: str | None, omit: Any) -> Any:
        """The provider SDK's async client with retries off (the pool retries), a connection
        pool as large as the concurrency may grow, and without the SDK's telemetry headers
        (`omit` is the SDK's `Omit()`): the HTTP library looks each header up case-blind, so
        every header sent costs on every request; `request_headers` drops those the SDK adds
        per request."""
        http = http_library(http_client_class)
        self._response = http.Response
        self.request_headers = dict.fromkeys(PER_REQUEST_TELEMETRY, omit)
        size = self.controller.maximum + 8
        return client_class(
            api_key=key,
            base_url=base_url,
            max_retries=0,
            timeout=self.timeout,
            default_headers=dict.fromkeys(TELEMETRY_HEADERS, omit),
            http_client=http_client_class(
                limits=http.Limits(max_connections=size, max_keepalive_connections=size), timeout=self.timeout
            ),
        )

    def endpoint(self, path: str) -> str:
        """The absolute URL of `path` under the SDK client's base URL: given whole, the SDK
        does not join a relative path to its base URL on every call."""
        return f"{str(self.client.base_url).rstrip('/')}/{path}"

    async def prepare(self) -> None:
        """Runs once before the first send (e.g. to ask a server how many slots it has)."""

    def check_model(self, model: str) -> None:
        """The server says which models it serves: an unknown one fails with `model_not_found`."""

    async def aclose(self) -> None:
        pass

    # -- the DirectRoute contract -------------------------------------------------------------

    def plan_for(self, count: int, seconds: float) -> None:
        """`count` requests must finish within `seconds`: raise the concurrency floor (up to
        max_concurrency) so that, at the latency seen so far (or `expected_latency`), they can.
        The floor holds for the next `execute` call."""
        self.controller.plan(count, seconds, self.expected_latency)

    async def execute(self, requests: Sequence[Request]) -> AsyncIterator[Outcome]:
        if not requests:
            return
        if not self._prepared:
            await self.prepare()
            self._prepared = True
        run = _Run(self, requests)
        self.pacer.renew()  # its lock belongs to this call's event loop
        try:
            run.fill()
            while run.yielded < run.total:
                if not run.out:
                    run.ready.clear()
                    await run.ready.wait()
                out, run.out = run.out, []
                run.yielded += len(out)
                for outcome in out:
                    yield outcome
        finally:
            tasks = list(run.tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            self.controller.clear_plan()

    # -- one request, with its in-route retries --------------------------------------------------

    async def complete(self, request: Request) -> Outcome:
        ctl, pacer = self.controller, self.pacer
        estimate = _estimate(request) if pacer.tokens is not None else 0
        tries = 0
        while True:
            tries += 1
            while (pause := ctl.delay()) > 0:
                await self.sleep(min(pause, MAX_PAUSE))
            if pacer.active:
                await pacer.acquire(estimate)
            ctl.sent()
            started = self.clock()
            try:
                outcome = await self.send(request)
            except CallFailed as failed:
                pause = None if failed.retry_after is None else min(failed.retry_after, MAX_PAUSE)
                ctl.done(self.clock() - started, ok=False, overload=failed.overload, retry_after=pause)
                if failed.retryable and tries <= self.max_retries:
                    if pause is None:
                        await self.sleep(self._backoff(tries))
                    continue
                after = f" (after {tries} tries)" if tries > 1 else ""
                return Outcome.failure(request.custom_id, failed.code, self.scrub(failed.message + after), failed.retryable)
            except Exception as err:  # a bug or a reply nobody expected: this request, not the pool
                ctl.done(self.clock() - started, ok=False)
                message = self.scrub(f"{self.name}: {type(err).__name__}: {err}")
                return Outcome.failure(request.custom_id, "route_error", message, True)
            ctl.done(self.clock() - started)
            if pacer.tokens is not None:
                pacer.settle(estimate, outcome.usage.input_tokens + outcome.usage.output_tokens)
            return outcome

    def _backoff(self, tries: int) -> float:
        first, longest = self.backoff
        return min(longest, first * 2 ** (tries - 1)) * self.rng.uniform(0.5, 1.0)

    def scrub(self, text: str) -> str:
        return scrub(self, text)


def _estimate(request: Request) -> int:
    """Tokens a request may use, before the provider says: characters / 4 of its
    conversation plus its output limit (or DEFAULT_OUTPUT when it sets none)."""
    asked = request.body.get(conversation_key(request.endpoint))
    chars = len(asked) if isinstance(asked, str) else sum(_chars(m) for m in asked or [])
    return math.ceil(chars / 4) + (request.output_limit or DEFAULT_OUTPUT)


def _chars(message: Any) -> int:
    content = message.get("content") if isinstance(message, dict) else message
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text") or "") if isinstance(p, dict) else 0 for p in content)
    return 0


class _Run:
    """One `execute` call: the requests left, the workers pulling them, the outcomes ready."""

    def __init__(self, route: PooledRoute, requests: Sequence[Request]):
        self.route = route
        self.requests = requests
        self.total = len(requests)
        self.next_index = 0
        self.workers = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.out: list[Outcome] = []
        self.yielded = 0
        self.ready = asyncio.Event()

    def fill(self) -> None:
        """Start workers until the limit is met (or every request has one)."""
        want = min(self.route.controller.limit, self.total - self.next_index + self.workers)
        while self.workers < want:
            self.workers += 1
            task = asyncio.get_running_loop().create_task(self._work())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _work(self) -> None:
        route = self.route
        try:
            while self.next_index < self.total and self.workers <= route.controller.limit:
                request = self.requests[self.next_index]
                self.next_index += 1
                outcome = await route.complete(request)
                self.out.append(outcome)  # after the await: `out` is swapped while it runs
                self.ready.set()
                if self.workers < route.controller.limit:
                    self.fill()
        finally:
            self.workers -= 1
