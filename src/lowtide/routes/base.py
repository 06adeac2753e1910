"""The two small contracts every route implements (httpx's transport: a method or two plus close).

A *direct* route executes requests now and yields outcomes as they finish, in any order.
A *batch* route hands a chunk to a provider and is polled until the provider is done.

Routes never touch the store: the engine hands them `Request`s and records what they
return. Routes translate SDK objects and errors into `Outcome`s at the edge.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from lowtide.core.errors import NotSent, RouteError
from lowtide.core.types import Outcome, Refusal, Request


@runtime_checkable
class DirectRoute(Protocol):
    kind: Literal["direct"]
    name: str
    # How many requests the engine should hand over in one dispatch.
    dispatch_size: int

    def check_model(self, model: str) -> None:
        """Raise `RouteError` naming the known models if `model` cannot run here."""
        ...

    def refusal(self, request: Request) -> Refusal | None:
        """What in `request` this route cannot honour (a field, a content part, a value),
        or None: asked before anything is submitted (DESIGN invariant 8)."""
        ...

    def execute(self, requests: Sequence[Request]) -> AsyncIterator[Outcome]:
        """Run the requests; yield one outcome per request as each finishes."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class BatchLimits:
    max_requests: int
    max_bytes: int
    one_model_per_batch: bool = False


@dataclass(slots=True)
class BatchStatus:
    """A provider batch as last polled. `phase` is the provider's own word for it."""

    phase: str
    ended: bool
    counts: dict[str, int] = field(default_factory=dict)
    # Set when the provider refused the whole batch (e.g. validation): its messages.
    errors: list[str] = field(default_factory=list)
    # The refusal was only that the provider's queue was full (OpenAI's enqueued-token
    # limit): the same batch is sent again later, and its requests lose no attempt.
    queue_full: bool = False


def scrub(route: object, text: str) -> str:
    """`text` without the route's API key (`route.secret`, where it holds one): a proxy or a
    self-hosted server may echo the request's Authorization header in an error, which the
    engine would otherwise keep in the store and print."""
    secret = getattr(route, "secret", None)
    return text.replace(secret, "[api key]") if secret else text


def number_option(route: str, options: dict[str, Any], key: str, default: Any, kind: type = int, minimum: float = 0) -> Any:
    """route_options[key] as a `kind` (int or float) of at least `minimum`, or `default` when
    it is not given; anything else is refused by name, never cut (2.5 is not a whole number)
    or read as a number it is not (true, NaN)."""
    value = options.get(key, default)
    if value is None:
        return None
    whole = kind is int
    try:
        number = kind(value)
        fits = not isinstance(value, bool) and number >= minimum and not (whole and isinstance(value, float) and value != number)
    except (TypeError, ValueError, OverflowError):
        fits = False
    if not fits:
        what = "a whole number" if whole else "a number"
        raise RouteError(f"{route}: route_options.{key} must be {what} ≥ {minimum:g}; got {value!r}")
    return number


def flag_option(route: str, options: dict[str, Any], key: str, default: bool) -> bool:
    """route_options[key] as true or false; `"no"` or 0 is refused, not read as true."""
    value = options.get(key, default)
    if not isinstance(value, bool):
        raise RouteError(f"{route}: route_options.{key} must be true or false; got {value!r}")
    return value


def text_option(route: str, options: dict[str, Any], key: str, default: str | None = None) -> str | None:
    """route_options[key] as text (a URL, a path, a name), or `default` when not given."""
    value = options.get(key, default)
    if value is not None and (not isinstance(value, str) or not value):
        raise RouteError(f"{route}: route_options.{key} must be text; got {value!r}")
    return value


def texts_option(route: str, options: dict[str, Any], key: str) -> list[str]:
    """route_options[key] as a list of texts (one text is a list of one), [] when not given:
    a text is never read as the list of its characters."""
    value = options.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RouteError(f"{route}: route_options.{key} must be a list of texts; got {value!r}")
    return value


def secret_of(key: str | None) -> str | None:
    """The key as `scrub` looks for it: a placeholder too short to be one is not replaced."""
    return key if key and len(key) >= 8 else None


@runtime_checkable
class BatchRoute(Protocol):
    kind: Literal["batch"]
    name: str
    limits: BatchLimits

    def check_model(self, model: str) -> None: ...

    def refusal(self, request: Request) -> Refusal | None: ...

    async def submit(self, key: str, requests: Iterable[Request]) -> str:
        """Create a provider batch tagged with `key`; return the provider's batch id.
        `requests` is iterated once, lazily: write it out rather than keep it."""
        ...

    async def find(
        self, key: str, size: int, not_before: float, known: Collection[str] = (), sent: Collection[str] | None = None
    ) -> str | None:
        """The id of a batch this dispatch already created, if the provider has one.

        `key` was attached to the batch where the provider keeps metadata; where it does
        not, a route may match on `size` (requests) and creation after `not_before` (Unix
        seconds), skipping the batches in `known` (other dispatches hold them), proving a
        candidate by the custom_ids its create carried (`sent`), and must raise rather than
        guess between several candidates."""
        ...

    async def poll(self, batch_id: str) -> BatchStatus: ...

    def results(self, batch_id: str) -> AsyncIterator[Outcome]:
        """Stream the outcomes of an ended batch, in the provider's order."""
        ...

    async def cancel(self, batch_id: str) -> None: ...

    async def aclose(self) -> None: ...


Route = DirectRoute | BatchRoute


class RouteFactory(Protocol):
    def __call__(self, options: dict[str, Any]) -> Route: ...


# Errors of a connection that was never made: nothing of the request left. By name, since
# each SDK brings its own transport (httpx, httpx2, httpcore, aiohttp); a timeout, or a
# connection dropped after it was made, may have sent the request and is not among them.
NOT_CONNECTED = frozenset({"ConnectError", "ClientConnectorError"})


def never_sent(err: BaseException | None) -> bool:
    """Whether an SDK's error provably sent nothing: the connection itself was refused or its
    host not found, before any byte of the request left."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, NotSent) or any(k.__name__ in NOT_CONNECTED for k in type(err).__mro__):
            return True
        err = err.__cause__ or err.__context__
    return False
