"""The gateway's endpoints.

    POST /v1/chat/completions, POST /v1/messages   decide, then forward or defer
    GET  /v1/deferred/{id}                          a deferred request's status (its tenant's only)
    GET  /v1/deferred?limit=&after=                 the tenant's deferred requests, newest first
    GET  /metrics                                   Prometheus text
    GET  /healthz
    GET  /openapi.json                              the schema (request bodies declared)
    *    /v1/…  (the allow-list, upstream_api.py)   forwarded in its tenant scope (scoped.py)

Every path is made canonical first (paths.py): one with `..`, `//` or double encoding is
refused (400) before anything else looks at it. Anything not on the allow-list is 404.

A deferrable request is deferred only if its API has a batch target and the target takes
its model; otherwise it goes real time and the answer's `X-Lowtide-Decision: realtime` says
so (`X-Lowtide-Reason`). Its body is stored verbatim (shape.py), so it must be one the
flush's routes can honour (admission.py): a request that must wait (`defer`) with a body
they refuse is a 400 naming the field and the route, and nothing is stored; one that only
may wait (`prefer_realtime`) goes real time instead, saying why. A request that prefers
real time and meets a 429 from the upstream is shaved rather than answered 429.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from lowtide.core.types import Refusal
from lowtide.server.bodies import parse_object, read_body, stream_body
from lowtide.server.errors import ApiError, api_of
from lowtide.server.gateway import openapi, records, scoped, shape, upstream_api
from lowtide.server.gateway.admission import Refused
from lowtide.server.gateway.context import Gateway
from lowtide.server.gateway.paths import PathRefused, canonical_path
from lowtide.server.gateway.policy import PolicyError, RequestInfo, Verdict, tags_of
from lowtide.server.gateway.safety import CallbackRefused, check_callback
from lowtide.server.gateway.tenants import CLIENT_HEADERS, QuotaExceeded
from lowtide.server.gateway.views import deferred_view, status_url

log = logging.getLogger("lowtide.gateway")
router = APIRouter()


def _gw(request: Request) -> Gateway:
    return request.app.state.gateway


def _tenant(gw: Gateway, request: Request, api: str) -> str:
    tenant = gw.tenants.identify(request.headers)
    if tenant is None:
        gw.metrics.refuse(api, "auth")
        if api == "anthropic":
            raise ApiError(401, "invalid x-api-key", type="authentication_error")
        raise ApiError(401, "Incorrect API key provided.", type="invalid_request_error", code="invalid_api_key")
    return tenant


def _admit(gw: Gateway, tenant: str, api: str) -> None:
    try:
        gw.tenants.admit(tenant)
    except QuotaExceeded as err:
        gw.metrics.refuse(api, "quota")
        raise ApiError(429, str(err), headers={"retry-after": str(max(1, int(err.retry_after + 0.999)))}) from None


async def _body(gw: Gateway, request: Request, api: str) -> bytes:
    """Bounded while reading, with a read timeout (server/bodies.py)."""
    try:
        return await read_body(request, gw.config.max_body_bytes, gw.config.body_timeout)
    except ApiError as err:
        if err.status == 413:
            gw.metrics.refuse(api, "size")
        raise


# The two hot endpoints are served by `hot_path` below, ahead of FastAPI's routing and
# middleware (which cost more than the rest of a deferred request's handling); these
# registrations are what an app without that fast path would use.
@router.post("/v1/chat/completions", openapi_extra=openapi.CHAT_COMPLETION)
async def chat_completions(request: Request) -> Response:
    return await handle(_gw(request), request, "openai")


@router.post("/v1/messages", openapi_extra=openapi.MESSAGE)
async def messages(request: Request) -> Response:
    return await handle(_gw(request), request, "anthropic")


HOT = {("POST", "/v1/chat/completions"): "openai", ("POST", "/v1/messages"): "anthropic"}


def hot_path(gw: Gateway, app: Any) -> Any:
    """An ASGI app: `POST /v1/chat/completions` and `/v1/messages` straight to `handle`,
    every other call (and the lifespan) to the FastAPI `app`."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        try:
            path = canonical_path(scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape"))
        except PathRefused as err:
            method = str(scope.get("method", ""))[:16]
            await ApiError(400, f"Invalid URL ({method} …): {err}.").response(api_of(scope["path"]))(scope, receive, send)
            return
        if path != scope["path"]:
            scope = {**scope, "path": path, "raw_path": path.encode("utf-8")}
        api = HOT.get((scope.get("method"), path))
        if api is None:
            await app(scope, receive, send)
            return
        try:
            response = await handle(gw, Request(scope, receive), api)
        except ApiError as err:
            response = err.response(api)
        except Exception as err:  # the body is not logged: it holds the prompt
            log.exception("gateway: %s %s failed: %s", scope["method"], scope["path"], type(err).__name__)
            response = ApiError(500, "The gateway had an error while processing your request.").response(api)
        await response(scope, receive, send)

    return asgi


async def handle(gw: Gateway, request: Request, api: str) -> Response:
    tenant = _tenant(gw, request, api)
    _admit(gw, tenant, api)
    raw = await _body(gw, request, api)
    try:  # depth-limited: a body nested 100,000 deep is a 400, not a RecursionError
        body = parse_object(raw, gw.config.max_json_depth)
    except ApiError:
        gw.metrics.refuse(api, "invalid")
        raise
    headers = request.headers
    model = body.get("model") if isinstance(body.get("model"), str) else ""
    info = RequestInfo(tenant, api, request.url.path, model, body, _visible(headers), tags_of(headers))
    try:
        verdict = gw.policy.decide(info)
    except PolicyError as err:
        gw.metrics.refuse(api, "invalid")
        raise ApiError(400, str(err)) from None
    row: dict[str, Any] | str = "realtime by policy"
    if verdict.mode != "realtime":
        row = _batchable(gw, api, model, body)
        if isinstance(row, Refused):
            if verdict.mode == "defer":  # it must wait, and cannot wait as it is: said, not run otherwise
                gw.metrics.refuse(api, "unbatchable")
                raise ApiError(400, row.message + unbatchable_fix(row.field, body), param=row.field)
            row = row.message
        if isinstance(row, dict):
            load = gw.loads.get(api)
            if verdict.mode == "defer":
                return await _defer(gw, request, api, tenant, model, row, verdict, "deferred", f"defer by {verdict.source}")
            if load is not None and load.overloaded():
                return await _defer(gw, request, api, tenant, model, row, verdict, "shaved", load.why())
    return await _forward(gw, request, api, tenant, model, raw, body, verdict, row)


def _visible(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k not in CLIENT_HEADERS}


RUN_NOW = "send it with X-Lowtide-Priority: realtime to run it now"


def unbatchable_fix(field: str, body: dict[str, Any]) -> str:
    """The caller's fix for a field the batch route refuses, in the caller's terms: a key
    the body has is removed or changed, one it lacks is added (the route's own words may
    speak of a job spec)."""
    key = field.split(".")[0].split("[")[0]
    if key not in body:
        return f"; add {key} to the body to defer this call, or {RUN_NOW}"
    return f"; change or remove {key} to defer this call, or {RUN_NOW}"


def _batchable(gw: Gateway, api: str, model: str, body: dict[str, Any]) -> dict[str, Any] | Refused | str:
    """The body to store if this request can be deferred; else what its flush's routes
    refuse in it (Refused), or why it is not for a batch at all (str)."""
    target = gw.target(api)
    if target is None:
        return f"no batch target for the {api} API"
    if not model:  # the upstream answers that in its own words
        return "no model"
    if target.models is not None and model not in target.models:
        return f"model {model!r} is not in batch.{api}.models"
    deferred = shape.deferred_body(body)
    if isinstance(deferred, Refusal):
        return Refused(deferred.field, f"{deferred.field}: {deferred.reason}")
    return gw.admissions[api].refused(deferred) or deferred


async def _forward(gw: Gateway, request: Request, api: str, tenant: str, model: str, raw: bytes,
                   body: dict[str, Any], verdict: Verdict, row: dict[str, Any] | str) -> Response:  # fmt: skip
    upstream = gw.upstreams.get(api)
    if upstream is None:
        raise ApiError(503, f"the gateway has no upstream for the {api} API (upstreams.{api})")
    load = gw.loads[api]
    load.started(len(raw) // 4 + _max_tokens(body))
    finished = False

    def done(status: int | None) -> None:
        nonlocal finished
        if not finished:
            finished = True
            load.finished(status)

    extra = {"x-lowtide-decision": "realtime"}
    if isinstance(row, str) and verdict.mode != "realtime":
        extra["x-lowtide-reason"] = _header_text(row[:200])
    response = await upstream.forward("POST", request.url.path, request.url.query, request.headers, raw, done, extra)
    if response.status_code == 429 and verdict.mode == "prefer_realtime" and isinstance(row, dict):
        await _discard(response)
        return await _defer(gw, request, api, tenant, model, row, verdict, "shaved", "the upstream answered 429 in real time")
    gw.metrics.decided(api, "realtime")
    log.debug("gateway: %s %s tenant=%s model=%s → realtime %d", api, request.url.path, tenant, model, response.status_code)
    return response


def _header_text(text: str) -> str:
    """A reason as a header value: it may quote the caller's own keys, which may hold any
    character (a header carries printable ASCII only)."""
    text = text.encode("ascii", "backslashreplace").decode("ascii")
    return "".join(c if " " <= c <= "~" else "?" for c in text)


async def _discard(response: Response) -> None:
    iterator = getattr(response, "body_iterator", None)
    if iterator is not None:
        await iterator.aclose()


def _max_tokens(body: dict[str, Any]) -> int:
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    return asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else 0


async def _defer(gw: Gateway, request: Request, api: str, tenant: str, model: str, row: dict[str, Any],
                 verdict: Verdict, decision: str, reason: str) -> Response:  # fmt: skip
    callback = request.headers.get("x-lowtide-callback")
    if callback:
        if gw.secret is None:
            gw.metrics.refuse(api, "callback")
            raise ApiError(400, f"X-Lowtide-Callback: webhooks are off on this gateway ({gw.config.webhooks.secret_env} is not set)")
        try:
            await check_callback(callback, gw.config.callbacks)
        except CallbackRefused as err:
            gw.metrics.refuse(api, "callback")
            raise ApiError(400, f"X-Lowtide-Callback: {err}") from None
    try:
        gw.tenants.reserve_pending(tenant)
    except QuotaExceeded as err:
        gw.metrics.refuse(api, "quota")
        raise ApiError(429, str(err), headers={"retry-after": str(int(err.retry_after))}) from None
    now = gw.clock.now()
    deadline = now + gw.policy.max_wait(verdict)
    expected, urgent = gw.expected_completion(api, now, deadline)
    gid = records.new_deferred_id()
    values = records.accepted_row(id=gid, tenant=tenant, api=api, model=model, payload=shape.stored(row), decision=decision,
                                  callback_url=callback or None, accepted_at=now, deadline_at=deadline, expected_at=expected)  # fmt: skip
    assert gw.writer is not None
    try:
        await gw.writer.write(values)
    except Exception:
        gw.tenants.release_pending(tenant)
        raise ApiError(503, "the gateway could not store the request; try again", headers={"retry-after": "1"}) from None
    if urgent and gw.collector is not None:
        gw.collector.wake()
    gw.metrics.decided(api, decision)
    log.debug("gateway: %s tenant=%s model=%s → %s %s", api, tenant, model, decision, gid)
    url = status_url(gw.public_url(), gid)
    answer = {"id": gid, "object": "lowtide.deferred", "status": "accepted", "decision": decision, "status_url": url,
              "created_at": now, "deadline_at": deadline, "expected_completion_at": expected}  # fmt: skip
    headers = {"location": url, "x-lowtide-decision": decision, "x-lowtide-reason": _header_text(reason)}
    return JSONResponse(answer, status_code=202, headers=headers)


def committed(gw: Gateway) -> Callable[[int], None]:
    """The writer's hook: wake the collector once a flush's worth has arrived."""
    pending = 0
    size = gw.config.collector.flush_size

    def on_commit(n: int) -> None:
        nonlocal pending
        pending += n
        if (pending >= size or gw.config.collector.flush_age == 0) and gw.collector is not None:
            pending = 0
            gw.collector.wake()

    return on_commit


# Status -------------------------------------------------------------------------------
@router.get("/v1/deferred/{gid}")
async def get_deferred(gid: str, request: Request) -> JSONResponse:
    gw = _gw(request)
    tenant = _tenant(gw, request, "openai")
    row = await asyncio.to_thread(_read, gw, gid)
    if row is None or row.tenant != tenant:  # another tenant's id is as unknown as a wrong one
        raise ApiError(404, f"No deferred request found with id '{gid}'.")
    return JSONResponse(deferred_view(row, gw.public_url()))


def _read(gw: Gateway, gid: str) -> Any:
    with gw.store.begin() as conn:
        return records.get_deferred(conn, gid)


@router.get("/v1/deferred")
async def list_deferred(request: Request, limit: int = 20, after: str | None = None) -> JSONResponse:
    gw = _gw(request)
    tenant = _tenant(gw, request, "openai")
    limit = max(1, min(limit, 100))

    def read() -> list[Any]:
        with gw.store.begin() as conn:
            return records.list_deferred(conn, tenant, limit + 1, after)

    rows = await asyncio.to_thread(read)
    data = [deferred_view(r, gw.public_url()) for r in rows[:limit]]
    return JSONResponse({"object": "list", "data": data, "has_more": len(rows) > limit,
                         "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None})  # fmt: skip


@router.get("/metrics")
async def metrics(request: Request) -> PlainTextResponse:
    gw = _gw(request)

    def read() -> dict[str, Any]:
        with gw.store.begin() as conn:
            return records.summary(conn)

    summary = await asyncio.to_thread(read)
    return PlainTextResponse(gw.metrics.render(summary, gw.loads), media_type="text/plain; version=0.0.4")


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.api_route("/v1/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
async def passthrough(rest: str, request: Request) -> Response:
    """The allow-listed upstream endpoints (upstream_api.py), each in its tenant scope."""
    gw = _gw(request)
    path = request.url.path
    tenant = _tenant(gw, request, api_of(path))
    found = upstream_api.match(request.method, path)
    if found is None or found[0].api not in gw.upstreams:
        raise ApiError(404, f"Unknown path {request.method} {path}")
    endpoint, object_id = found
    _admit(gw, tenant, endpoint.api)
    if not endpoint.upload:
        return await scoped.serve(gw, request, endpoint, object_id, tenant, await _body(gw, request, endpoint.api))
    try:  # a batch file: passed on as it arrives, never held whole
        body = stream_body(request, gw.config.max_upload_bytes, gw.config.body_timeout)
        return await scoped.serve(gw, request, endpoint, object_id, tenant, body)
    except ApiError as err:
        if err.status == 413:
            gw.metrics.refuse(endpoint.api, "size")
        raise
