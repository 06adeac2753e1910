"""The two small contracts every route implements (httpx's transport: a method or two plus close).

A *direct* route executes requests now and yields outcomes as they finish, in any order.
A *batch* route hands a chunk to a provider and is polled until the provider is done.

Routes never touch the store: the engine hands them `Request`s and records what they
return. Routes translate SDK objects and errors into `Outcome`s at the edge.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol, runtime_checkable

from lowtide.core.types import Outcome, Refusal, Request


class LazyClient:
    """A route's SDK client (`self.client`), made by `self.make_client()` on its first use,
    not when the route is. A route made only to check a job (each load makes one per lane)
    then builds none: an SDK client's HTTP client loads the CA bundle, 30 ms for openai's or
    anthropic's and 90 ms for google-genai's. The options are still read and refused when the
    route is made; only the client waits."""

    make_client: Callable[[], Any]

    @cached_property
    def client(self) -> Any:
        return self.make_client()

    def made_client(self) -> Any | None:
        """The client if it was made (what `aclose` closes), else None."""
        return self.__dict__.get("client")


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
        or None: asked before anything is submitted (DESIGN invariant 8). A route may also
        have `rest_decides(endpoint, turns) -> bool`: True where a body with these turns is
        refused or not by the rest of the body alone, so the loader asks once for a job's rows
        that differ in their turns alone (routes/own/echo.py)."""
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
    min_requests: int = 1  # a provider that refuses a smaller batch (Bedrock: 100 records a job)


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
