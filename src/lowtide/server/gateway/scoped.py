"""The allow-listed passthrough (upstream_api.py), each endpoint in its scope: tenants share
one upstream key, so the gateway is what keeps one tenant's files and batches from another.

- shared: forwarded as it is.
- create: forwarded; the new object (its `id` in the answer) is recorded as the caller's.
  A batch may only be made from the caller's own input file.
- owned: the object must be the caller's (owned.py), else 404 in the API's shape — the same
  answer as for an id that does not exist, so ids of others cannot be probed.
- list: the caller's own objects from the gateway's records, newest first, each document
  from documents.py where it is known, else read from the upstream (at most READS_AT_ONCE
  at a time; one that the upstream no longer has is left out). Files never change, so a
  tenant listing its files in a loop costs the shared key nothing.

A batch object on its way back is looked at, not rebuilt: an OpenAI batch's output and
error files become the caller's, and an Anthropic batch's `results_url` (the upstream's
own address) is pointed at the gateway, under `public_url` or relative.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lowtide.server.bodies import parse_object
from lowtide.server.errors import ApiError
from lowtide.server.gateway import owned
from lowtide.server.gateway.context import Gateway
from lowtide.server.gateway.documents import Documents, is_gone
from lowtide.server.gateway.proxy import UpstreamClient, relayed
from lowtide.server.gateway.upstream_api import Endpoint

OBJECT_PATHS = {"file": "/v1/files/{}", "batch": "/v1/batches/{}", "message_batch": "/v1/messages/batches/{}"}
WHAT = {"file": "file", "batch": "batch", "message_batch": "message batch"}
OUTPUT_FILES = ("output_file_id", "error_file_id")
MAX_PAGE = 100
READS_AT_ONCE = 8  # documents one listing reads from the upstream at a time


def not_found(api: str, kind: str, object_id: str, param: str | None = None) -> ApiError:
    if api == "anthropic":
        return ApiError(404, f"{WHAT[kind]} not found: {object_id}")
    return ApiError(404, f"No {WHAT[kind]} found with id '{object_id}'.", param=param)


async def serve(
    gw: Gateway, request: Request, endpoint: Endpoint, object_id: str | None, tenant: str, raw: bytes | AsyncIterator[bytes]
) -> Response:
    upstream = gw.upstreams[endpoint.api]
    method, path, query, headers = request.method, request.url.path, request.url.query, request.headers
    if endpoint.scope == "shared":
        return await upstream.forward(method, path, query, headers, raw, lambda status: None)
    kind = endpoint.kind
    assert kind is not None
    if endpoint.scope == "list":
        return await _list(gw, upstream, endpoint, tenant, request)
    if endpoint.scope == "owned":
        assert object_id is not None
        if await _owner(gw, endpoint.api, kind, object_id) != tenant:
            raise not_found(endpoint.api, kind, object_id)  # the same answer as for an id that is not there
        if endpoint.shows:
            return await _shown(gw, tenant, endpoint, await upstream.call(method, path, query, headers, raw))
        response = await upstream.forward(method, path, query, headers, raw, lambda status: None)
        if method == "DELETE" and 200 <= response.status_code < 300:
            _documents(gw).forget(endpoint.api, kind, object_id)
            await asyncio.to_thread(_owners(gw).forget, endpoint.api, kind, object_id)
        return response
    if kind == "batch":  # create
        assert isinstance(raw, bytes)  # a batch is JSON read whole; only uploads stream
        await _check_input_file(gw, tenant, raw)
    answer = await upstream.call(method, path, query, headers, raw)
    obj = _object_of(answer)
    if obj is not None and isinstance(obj.get("id"), str):
        await asyncio.to_thread(owned.record, gw.store, tenant, endpoint.api, kind, [obj["id"]], gw.clock.now())
        _documents(gw).put(endpoint.api, kind, obj, gw.clock.now())
    return await _shown(gw, tenant, endpoint, answer)


async def _check_input_file(gw: Gateway, tenant: str, raw: bytes) -> None:
    """A batch is made only from the caller's own file: else it would read another's."""
    body = parse_object(raw, gw.config.max_json_depth)  # a 400 naming the problem
    if _top_keys(raw).count("input_file_id") > 1:  # parsers differ on which one wins: the upstream's may not be ours
        raise ApiError(400, "input_file_id: given more than once; give it once", param="input_file_id")
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise ApiError(400, "input_file_id: give the id of a file you uploaded (purpose 'batch')", param="input_file_id")
    if await _owner(gw, "openai", "file", file_id) != tenant:
        raise not_found("openai", "file", file_id, param="input_file_id")


def _top_keys(raw: bytes) -> list[str]:
    """The top-level object's keys as written, repeats kept (the body is known to be an
    object within the depth limit by now, so the standard parser's recursion is bounded)."""
    keys: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys[:] = [k for k, _ in items]  # the top level is the last object to close
        return dict(items)

    json.loads(raw, object_pairs_hook=pairs)
    return keys


def _object_of(answer: httpx.Response) -> dict[str, Any] | None:
    if not 200 <= answer.status_code < 300:
        return None
    try:
        obj = answer.json()
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


async def _shown(gw: Gateway, tenant: str, endpoint: Endpoint, answer: httpx.Response) -> Response:
    obj = _object_of(answer)
    if obj is None or not endpoint.shows or endpoint.kind is None:
        return relayed(answer)
    if endpoint.method == "GET":  # a retrieve: the freshest document there is
        _documents(gw).put(endpoint.api, endpoint.kind, obj, gw.clock.now())
    return relayed(answer, json.dumps(await _looked_at(gw, tenant, endpoint.kind, obj)).encode())


async def _looked_at(gw: Gateway, tenant: str, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """A batch object as the caller may see it; its output files recorded as the caller's."""
    if kind == "batch":
        files = [obj[k] for k in OUTPUT_FILES if isinstance(obj.get(k), str) and obj[k]]
        files = [f for f in files if _owners(gw).cached("openai", "file", f) is None]
        if files:
            await asyncio.to_thread(_adopt_files, gw, tenant, files)
    elif kind == "message_batch" and obj.get("results_url") and isinstance(obj.get("id"), str):
        obj = {**obj, "results_url": f"{gw.public_url() or ''}/v1/messages/batches/{obj['id']}/results"}
    return obj


def _owners(gw: Gateway) -> owned.Owners:
    assert gw.owners is not None
    return gw.owners


def _documents(gw: Gateway) -> Documents:
    assert gw.documents is not None
    return gw.documents


async def _owner(gw: Gateway, api: str, kind: str, object_id: str) -> str | None:
    known = _owners(gw).cached(api, kind, object_id)  # a batch being polled: no store read
    return known if known is not None else await asyncio.to_thread(_owners(gw).owner, api, kind, object_id)


def _adopt_files(gw: Gateway, tenant: str, files: list[str]) -> None:
    new = [f for f in files if _owners(gw).owner("openai", "file", f) is None]  # read first: polls stay reads
    if new:
        owned.record(gw.store, tenant, "openai", "file", new, gw.clock.now())


async def _list(gw: Gateway, upstream: UpstreamClient, endpoint: Endpoint, tenant: str, request: Request) -> Response:
    kind = endpoint.kind
    assert kind is not None
    q = request.query_params
    raw_limit = q.get("limit", "20")
    if not (raw_limit.isascii() and raw_limit.isdigit()) or int(raw_limit) < 1:  # isdigit alone takes '²'; int does not
        raise ApiError(400, f"limit: give a whole number from 1 to {MAX_PAGE}; got {raw_limit[:20]!r}", param="limit")
    limit = min(int(raw_limit), MAX_PAGE)
    after = q.get("after_id") if endpoint.api == "anthropic" else q.get("after")
    before = q.get("before_id") if endpoint.api == "anthropic" else None
    ids = await asyncio.to_thread(owned.page, gw.store, tenant, endpoint.api, kind, limit + 1, after, before)
    has_more = len(ids) > limit
    ids = ids[1:] if has_more and before is not None else ids[:limit]
    docs, now = _documents(gw), gw.clock.now()
    known = {i: doc for i in ids if (doc := docs.get(endpoint.api, kind, i, now)) is not None}
    gate = asyncio.Semaphore(READS_AT_ONCE)

    async def read(object_id: str) -> httpx.Response:
        async with gate:
            return await upstream.call("GET", OBJECT_PATHS[kind].format(object_id), "", request.headers)

    missing = [i for i in ids if i not in known]
    for object_id, answer in zip(missing, await asyncio.gather(*(read(i) for i in missing)), strict=True):
        if answer.status_code == 404:  # gone at the upstream (deleted, expired)
            continue
        obj = _object_of(answer)
        if obj is None:
            return relayed(answer)  # the upstream's own trouble, as it said it
        docs.put(endpoint.api, kind, obj, now)
        known[object_id] = obj
    data = []
    for object_id in ids:
        obj = known.get(object_id)
        if obj is not None and not is_gone(kind, obj, now):
            data.append(await _looked_at(gw, tenant, kind, obj))
    purpose = q.get("purpose")
    if kind == "file" and purpose:
        data = [f for f in data if f.get("purpose") == purpose]
    # The cursors are positions in the caller's records, kept even if an object is left out.
    page: dict[str, Any] = {"data": data, "has_more": has_more, "first_id": ids[0] if ids else None,
                            "last_id": ids[-1] if ids else None}  # fmt: skip
    if endpoint.api == "openai":
        page = {"object": "list", **page}
    return JSONResponse(page)
