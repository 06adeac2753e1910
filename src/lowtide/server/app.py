"""The Batch API server: OpenAI's Files and Batches (under Azure OpenAI's `/openai` paths
too, azure_paths.py), Mistral's batch jobs (under `/mistral`, mistral_api.py) and
Anthropic's Message Batches, over any lowtide route. Each API batch runs as a lowtide job in
the store. A direct backend also answers in real time
(`/v1/chat/completions`, `/v1/messages`). Every job of the store is shown at `/dashboard` and
counted at `/metrics` (server/dashboard.py, metrics.py).

    app = create_app(ServeConfig(backend="echo", time_scale=3600))
    uvicorn.run(app, port=8000)
"""

from __future__ import annotations

import hmac
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

from fastapi import FastAPI, Request

from lowtide.core.errors import SpecError
from lowtide.routes import create_route
from lowtide.server import (
    anthropic_api,
    azure_paths,
    bedrock_api,
    dashboard,
    dashboard_evals,
    digitalocean_api,
    errors,
    faults,
    files,
    gemini_api,
    gemini_files,
    gemini_versions,
    guard,
    metrics,
    mistral_api,
    models_api,
    openai_api,
    openrouter_api,
    realtime_api,
    safejson,
    stored_api,
    vertex_api,
)
from lowtide.server.backend import Backend
from lowtide.server.clock import ScaledClock, SteppedClock
from lowtide.server.context import ServeConfig, Server
from lowtide.server.errors import ApiError, api_of
from lowtide.server.faults import FaultPlan, Faults
from lowtide.server.lifecycle import Worker
from lowtide.store.db import Store

log = logging.getLogger("lowtide.serve")


def create_app(config: ServeConfig) -> FastAPI:
    """Build the app; the store opens now, the worker starts with the app's lifespan."""
    _check_limits(config)
    _check_lines_policy(config)
    # An unknown backend fails here, listing the known ones. A direct backend runs on its own
    # thread, one instance shared by the worker and the real-time endpoints (server/backend.py).
    route = config.routes.get(config.backend)
    route = create_route(config.backend, config.route_options) if route is None else route
    backend = Backend(route, owned=config.backend not in config.routes) if route.kind == "direct" else None
    if backend is not None:
        config = replace(config, routes={**config.routes, config.backend: backend.route})
    plan = FaultPlan.load(config.faults) if config.faults else FaultPlan()
    data_dir = config.data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(config.db)
    clock = SteppedClock(config.clock) if config.clock is not None else ScaledClock.open(store, config.time_scale)
    server = Server(config, store, clock, Faults(plan), data_dir, route=route)
    worker = Worker(server)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not config.api_keys:
            log.warning("lowtide serve: no API keys configured; any key is accepted")
        if backend is not None:
            backend.start()
        if config.run_worker:
            worker.start()
        try:
            yield
        finally:
            worker.stop()
            await worker.aclose()
            if backend is not None:
                backend.stop()
            store.close()

    app = FastAPI(title="lowtide Batch API", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.server = server
    app.state.worker = worker  # run_worker=False: the embedder calls `await worker.run_once()`
    app.state.backend = backend  # None for a batch backend: real time then answers 501
    errors.install(app)
    faults.install(app, server.faults, config.swappable_faults)  # inner: runs after the key check
    _install_auth(app, config.api_keys)
    app.add_middleware(gemini_versions.GeminiVersions)  # the others see Gemini's /v1 as /v1beta
    guard.protect(app, config)  # other sites are refused before anything else (guard.py) ...
    app.add_middleware(azure_paths.MovedPaths)  # ... but Azure's /openai/… paths are OpenAI's /v1/… first
    app.add_middleware(azure_paths.MovedPaths, prefix=mistral_api.PREFIX, moved=mistral_api.moved)  # ... and Mistral's /mistral/v1/… serve's own (mistral_api.py)
    app.include_router(mistral_api.files_router)  # before OpenAI's /v1/files/{id}/…
    app.include_router(mistral_api.jobs_router)
    app.include_router(openrouter_api.router)  # OpenRouter's /api/v1/batches
    app.include_router(digitalocean_api.router)  # DigitalOcean's /digitalocean/v1/batches and its presigned URLs
    app.include_router(bedrock_api.router)  # Bedrock's /model-invocation-job(s) (its input and output in S3)
    app.include_router(vertex_api.router)  # Vertex AI's batchPredictionJobs (its /v1 moved to /v1beta, gemini_versions.py)
    for module in (files, openai_api, anthropic_api, gemini_files, gemini_api, models_api, stored_api, realtime_api, dashboard, dashboard_evals, metrics):
        app.include_router(module.router)
    return app


def _check_lines_policy(config: ServeConfig) -> None:
    """`max_attempts` and `fallback` as a job spec would take them, refused at start."""
    from lowtide.core.spec import FallbackSpec, RetrySpec

    try:
        RetrySpec(max_attempts=config.max_attempts)
        if config.fallback is not None:
            fallback = FallbackSpec(**config.fallback)
            create_route(fallback.route, fallback.route_options)  # an unknown route, a missing key: said now
    except (ValueError, TypeError) as err:
        raise SpecError(f"serve's retry and fallback: {err}") from None


def _check_limits(config: ServeConfig) -> None:
    if not 2 <= config.max_json_depth <= safejson.MAX_DEPTH:
        raise SpecError(f"max_json_depth is {config.max_json_depth}; give 2 to {safejson.MAX_DEPTH} (the default is {safejson.DEFAULT_DEPTH})")
    if not (math.isfinite(config.body_timeout) and config.body_timeout > 0):
        raise SpecError(f"body_timeout is {config.body_timeout}; give a number of seconds above 0 (the default is 30)")
    for name in ("max_request_bytes", "anthropic_max_bytes", "max_file_bytes"):
        if getattr(config, name) < 1024:
            raise SpecError(f"{name} is {getattr(config, name)}; give at least 1024 bytes")


def _install_auth(app: FastAPI, keys: tuple[str, ...]) -> None:
    """With keys configured, every /v1 call must carry one (`Authorization: Bearer KEY` as
    OpenAI's SDK sends it, `x-api-key` as Anthropic's does, `api-key` as Azure OpenAI takes
    it), and every Gemini call (/v1beta,
    /upload; a Gemini call on /v1 arrives here as /v1beta, gemini_versions.py) its `x-goog-api-key`. Keys are never logged."""
    if not keys:
        return
    wanted = [k.encode() for k in keys]

    def known(key: str | None) -> bool:
        return key is not None and any(hmac.compare_digest(key.encode(), w) for w in wanted)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if not request.url.path.startswith(("/v1/", "/v1beta/", "/upload/", "/api/v1/")):
            return await call_next(request)
        bearer = request.headers.get("authorization", "")
        given = request.headers.get("x-api-key") or request.headers.get("x-goog-api-key") or request.headers.get("api-key")
        given = given or (bearer[7:].strip() if bearer.lower().startswith("bearer ") else None)
        if known(given):
            return await call_next(request)
        api = api_of(request.url.path)
        if api == "gemini" and "/projects/" in request.url.path:  # Vertex AI: an OAuth token, refused as Vertex does
            return ApiError(401, "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
                            "cookie or other valid authentication credential.").response(api)  # fmt: skip
        if api == "gemini":
            return ApiError(401 if given is None else 400, "API key not valid. Please pass a valid API key.").response(api)
        if api == "openrouter":
            return ApiError(401, "No auth credentials found" if given is None else "User not found.").response(api)
        if api == "anthropic":
            message = "x-api-key header is required" if given is None else "invalid x-api-key"
            return ApiError(401, message, type="authentication_error").response(api)
        if given is None:
            message = ("You didn't provide an API key. You need to provide your API key in an Authorization "
                       "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")  # fmt: skip
            return ApiError(401, message, type="invalid_request_error").response(api)
        return ApiError(401, "Incorrect API key provided.", type="invalid_request_error", code="invalid_api_key").response(api)
