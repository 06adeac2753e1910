"""The peak-shaving gateway: OpenAI's `POST /v1/chat/completions` and Anthropic's
`POST /v1/messages` in front of a real-time upstream and a batch route. Existing clients
change only their base URL.

    app = create_gateway_app(load_gateway_config("gateway.yaml"))
    uvicorn.run(app, port=8080)

Per request (handlers.py): the tenant is identified by its key; the policy (policy.py)
says whether it may wait; the upstream's load (load.py) decides for requests that prefer
real time. Urgent requests are forwarded as they are (proxy.py; streams pass through).
Deferred ones are committed to the store (writer.py, group commit) and answered `202
Accepted` with an id, a status URL and the expected completion time; the collector
(collector.py, its own thread) runs them as lowtide jobs and delivers the results
(webhooks.py). Everything a deferred request is lives in the store, so a restarted gateway
carries on where the last one stopped.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI

from lowtide.core.clock import Clock, SystemClock
from lowtide.core.errors import RouteError, SpecError, UnknownRouteError
from lowtide.routes import create_route
from lowtide.server import errors
from lowtide.server.gateway import handlers, records
from lowtide.server.gateway.admission import admission_for
from lowtide.server.gateway.collector import Collector
from lowtide.server.gateway.config import GatewayConfig
from lowtide.server.gateway.context import APIS, Gateway
from lowtide.server.gateway.documents import Documents
from lowtide.server.gateway.load import LoadTracker
from lowtide.server.gateway.metrics import Metrics
from lowtide.server.gateway.owned import Owners
from lowtide.server.gateway.policy import Policy, RequestInfo
from lowtide.server.gateway.proxy import UpstreamClient
from lowtide.server.gateway.tenants import Tenants
from lowtide.server.gateway.writer import GroupWriter
from lowtide.store.db import Store

log = logging.getLogger("lowtide.gateway")


def create_gateway_app(
    config: GatewayConfig,
    *,
    db: str | None = None,
    clock: Clock | None = None,
    routes: dict[str, Any] | None = None,
    classifier: Callable[[RequestInfo], Any] | None = None,
    run_collector: bool = True,
) -> GatewayApp:
    """Build the gateway; the store opens now, the writer and collector start with the
    app's lifespan. `db` overrides `config.db`; `clock`, `routes` (ready-made route
    instances for the engine, by name) and `classifier` are for embedding and tests.
    `run_collector` False: the collector is made but its thread is not started; whoever
    embeds the gateway runs its passes (`collector.step`, `collector.deliverer.run_due`),
    as the simulation does (tests/sim/gateway.py), so nothing races it."""
    clock = clock or SystemClock()
    try:
        policy = Policy(config, classifier)
    except ValueError as err:
        raise SpecError(f"gateway config: {err}") from None
    kinds = _check_targets(config, routes or {})
    data_dir = config.resolve(config.data_dir).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(db or config.db)
    secret = os.environ.get(config.webhooks.secret_env)
    gateway = Gateway(
        config=config, store=store, clock=clock, data_dir=data_dir, tenants=Tenants(config, clock), policy=policy,
        metrics=Metrics(), secret=secret.encode() if secret else None, routes=dict(routes or {}), route_kinds=kinds,
        owners=Owners(store), documents=Documents(),
    )  # fmt: skip
    for api in APIS:
        target = gateway.target(api)
        if target is not None:
            gateway.admissions[api] = admission_for(api, target, gateway.fallback_for(api), gateway.routes)
        up = gateway.upstream_config(api)
        if up is not None:
            if up.api_key_env and not os.environ.get(up.api_key_env):
                store.close()
                raise SpecError(f"gateway config: upstreams.{api}.api_key_env: set the environment variable {up.api_key_env}")
            gateway.loads[api] = LoadTracker(up.limits, clock)
    # httpx logs every request's URL at INFO; a callback URL may carry a token in its query.
    httpx_log = logging.getLogger("httpx")
    httpx_log.setLevel(max(httpx_log.level, logging.WARNING))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if gateway.tenants.open:
            log.warning("lowtide gateway: no tenants configured; any key is accepted as tenant 'default'")
        if secret is None:
            log.warning("lowtide gateway: %s is not set; requests with a callback URL are refused", config.webhooks.secret_env)
        clients = []
        for api in APIS:
            up = gateway.upstream_config(api)
            if up is not None:
                # One pool per upstream, no bigger than what may be in flight to it: httpx's
                # pool scans every connection it holds on each request.
                n = up.max_connections
                clients.append(httpx.AsyncClient(limits=httpx.Limits(max_connections=n, max_keepalive_connections=n), timeout=up.timeout))
                gateway.upstreams[api] = UpstreamClient(api, up, clients[-1])
        with store.begin() as conn:
            gateway.tenants.set_pending(records.pending_by_tenant(conn))
        collector = gateway.collector = Collector(gateway)
        writer = gateway.writer = GroupWriter(store, on_commit=handlers.committed(gateway))
        writer.start()
        if run_collector:
            collector.start()
        try:
            yield
        finally:
            await writer.stop()
            if run_collector:
                await asyncio.to_thread(collector.stop)
            else:  # its deliveries' client, which the stopping thread would close
                await collector.deliverer.aclose()
            for client in clients:
                await client.aclose()
            store.close()

    # /openapi.json: the gateway's own endpoints (the passthrough's are the providers' own).
    app = FastAPI(title="lowtide gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.gateway = gateway
    errors.install(app)
    app.include_router(handlers.router)
    return GatewayApp(app, handlers.hot_path(gateway, app))


class GatewayApp:
    """The ASGI app uvicorn runs: the hot endpoints ahead of FastAPI (handlers.hot_path).
    `state` and `app` are the FastAPI app's."""

    def __init__(self, app: FastAPI, asgi: Any):
        self.app = app
        self.state = app.state
        self._asgi = asgi

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._asgi(scope, receive, send)


def _check_targets(config: GatewayConfig, given: dict[str, Any]) -> dict[str, str]:
    """Every batch target's route (and fallback route) exists and takes its options: refused
    at start-up rather than at the first flush. Returns each API's route kind."""
    kinds: dict[str, str] = {}
    probe = Gateway(config=config, store=None, clock=SystemClock(), data_dir=None, tenants=None, policy=None,  # type: ignore[arg-type]
                    metrics=Metrics(), secret=None)  # fmt: skip
    for api in APIS:
        target = probe.target(api)
        if target is None:
            continue
        try:
            route = given.get(target.route) or create_route(target.route, target.route_options)
            kinds[api] = route.kind
            if target.models:
                for model in set(target.models.values()):
                    route.check_model(model)
            fallback = probe.fallback_for(api)
            if fallback is not None and fallback[0] != target.route and fallback[0] not in given:
                create_route(fallback[0], fallback[1])
        except UnknownRouteError as err:
            raise SpecError(f"gateway config: batch.{api}: {err}") from None
        except RouteError as err:
            raise SpecError(f"gateway config: batch.{api}: {err}") from None
    return kinds
