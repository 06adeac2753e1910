"""`RayPool`: a direct route that runs another direct route on a Ray cluster.

Self-hosted inference beyond one machine: each Ray actor holds one instance of the inner
route (one model engine: the embedded `local` model on a CPU node; an `openai-compatible`
client next to a vLLM server on a GPU node; any registered direct route), built on the node
the actor lands on. The engine hands the pool a dispatch exactly as it would hand the inner
route; the pool cuts it into shards, keeps every actor busy with up to `shards_per_actor`
shards, and yields each shard's outcomes as it comes back. Leases, retries, ingest and the
store stay with the engine on the driver: an actor never touches the store.

    pool = RayPool("local", {"slots": 8}, actors=4, num_cpus=2, address="auto")
    async with Engine(store, routes={"local": pool}) as engine:
        await drive(engine, "classify-tickets")

A shard whose actor died comes back as retryable `route_error` outcomes; the engine sends
those requests again (and Ray restarts the actor, `max_restarts`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from lowtide.core.errors import RouteError
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes import create_route


class _RouteActor:
    """Lives in a Ray worker process: one inner route instance. Shards run one at a time (a
    route such as `local` owns one model context); the next one waits queued in the actor."""

    def __init__(self, route: str, options: dict[str, Any]):
        self.route = create_route(route, options)
        if self.route.kind != "direct":
            raise RouteError(f"ray: route {route} is a batch route; a Ray pool runs direct routes")
        self.lock = asyncio.Lock()

    def check_model(self, model: str) -> None:
        self.route.check_model(model)

    async def run(self, requests: list[Request]) -> list[Outcome]:
        async with self.lock:
            return [outcome async for outcome in self.route.execute(requests)]


class RayPool:
    kind: Literal["direct"] = "direct"

    def __init__(
        self,
        route: str,
        options: dict[str, Any] | None = None,
        *,
        actors: int = 2,
        num_cpus: float = 1,
        num_gpus: float = 0,
        shard_size: int = 64,
        shards_per_actor: int = 2,
        address: str | None = None,
        init_options: dict[str, Any] | None = None,
    ):
        """`address`: a running cluster ("auto", "ray://head:10001"), or None for a local
        instance (`init_options` go to `ray.init`, e.g. {"num_cpus": 2})."""
        import ray  # an optional dependency: `pip install lowtide[ray]`

        if actors < 1 or shard_size < 1 or shards_per_actor < 1:
            raise RouteError("ray: actors, shard_size and shards_per_actor must be at least 1")
        if not ray.is_initialized():
            ray.init(address=address, **(init_options or {}))
        self._ray = ray
        self.name = route
        self.shard_size = shard_size
        self.shards_per_actor = shards_per_actor
        self._remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=2)(_RouteActor)
        self._options = dict(options or {})
        self._checker: Any = None
        self._actors = [self._new_actor() for _ in range(actors)]
        # Enough per dispatch that every actor has work queued while the engine commits.
        self.dispatch_size = actors * shards_per_actor * shard_size * 4

    def _new_actor(self):
        return self._remote.remote(self.name, self._options)

    def check_model(self, model: str) -> None:
        self._ray.get(self._actors[0].check_model.remote(model))

    def refusal(self, request: Request) -> Refusal | None:
        """The inner route's answer, from an instance here: a remote call per row would cost
        more than the check (building a route opens nothing: `local` loads its model on use)."""
        if self._checker is None:
            self._checker = create_route(self.name, self._options)
        check = getattr(self._checker, "refusal", None)
        return check(request) if check is not None else None

    async def execute(self, requests: Sequence[Request]) -> AsyncIterator[Outcome]:
        shards = [list(requests[i : i + self.shard_size]) for i in range(0, len(requests), self.shard_size)]
        shards.reverse()  # pop() from the end: the dispatch's order
        running: dict[asyncio.Future, tuple[int, list[Request]]] = {}
        load = [0] * len(self._actors)

        def feed() -> None:
            while shards:
                actor = min(range(len(load)), key=load.__getitem__)
                if load[actor] >= self.shards_per_actor:
                    return
                shard = shards.pop()
                running[asyncio.ensure_future(self._actors[actor].run.remote(shard))] = (actor, shard)
                load[actor] += 1

        feed()
        while running:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                actor, shard = running.pop(future)
                load[actor] -= 1
                try:
                    outcomes = future.result()
                except Exception as err:  # the actor died or the route broke: send them again
                    if isinstance(err, self._ray.exceptions.RayActorError):
                        self._actors[actor] = self._new_actor()  # gone for good: replace it
                    message = f"ray actor failed: {type(err).__name__}: {str(err).splitlines()[0][:300]}"
                    outcomes = [Outcome.failure(r.custom_id, "route_error", message, True) for r in shard]
                for outcome in outcomes:
                    yield outcome
            feed()

    async def aclose(self) -> None:
        for actor in self._actors:
            self._ray.kill(actor)
        self._actors = []
