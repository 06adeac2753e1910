"""Reading request bodies, for every endpoint of serve and the gateway that takes one.

- The byte limit is enforced while reading: a declared `Content-Length` over it is refused
  at once, a chunked body as soon as it passes it; nothing is buffered beyond the limit.
- A read timeout: a client that stops sending for `timeout` seconds gets 408 and the
  connection closes (uvicorn's keep-alive timeout covers only the time between requests).
- JSON is parsed with a depth limit (safejson.py): 400 naming where, never a RecursionError.

Errors are `ApiError`s, answered in the endpoint's provider shape (errors.py).

    raw = await read_body(request, limit=32 * MB, timeout=30.0)
    body = parse_object(raw, max_depth=64)
    async for chunk in stream_body(request, limit, timeout): ...
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import ClientDisconnect, Request

from lowtide.server import safejson
from lowtide.server.errors import ApiError

DEFAULT_TIMEOUT = 30.0  # seconds a client may leave a body waiting for its next bytes
# A stalled client's connection is ended. After a 413 it is not: uvicorn drops the rest of
# the body as it comes (its keep-alive timeout ends a connection still sending after that),
# so a client that sends its whole body before reading (the SDKs) still reads the 413.
CLOSE = {"connection": "close"}


def too_large(limit: int, what: str = "The request body") -> ApiError:
    return ApiError(413, f"{what} is too large: the limit is {limit} bytes.")


async def stream_body(request: Request, limit: int, timeout: float = DEFAULT_TIMEOUT,
                      what: str = "The request body") -> AsyncIterator[bytes]:  # fmt: skip
    """The body's chunks as they arrive; 413 once more than `limit` bytes came (or were
    declared), 408 when none came for `timeout` seconds."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit, what)
    size = 0
    more = True
    while more:
        try:
            async with asyncio.timeout(timeout):  # a timer, not a task per chunk (the gateway's hot path)
                message = await request.receive()
        except TimeoutError:
            raise ApiError(408, f"{what} was not received in time: nothing arrived for {timeout:g} seconds.", headers=CLOSE) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            raise too_large(limit, what)
        if chunk:
            yield chunk


async def read_body(request: Request, limit: int, timeout: float = DEFAULT_TIMEOUT, what: str = "The request body") -> bytes:
    """The whole body, at most `limit` bytes (for bodies small enough to hold)."""
    data = bytearray()
    async for chunk in stream_body(request, limit, timeout, what):
        data += chunk
    return bytes(data)


def parse_object(raw: bytes, max_depth: int = safejson.DEFAULT_DEPTH, what: str = "the request body") -> dict[str, Any]:
    """A body that must be one JSON object; 400 naming the problem otherwise."""
    try:
        value = safejson.loads(raw, max_depth)
    except safejson.TooDeep as err:
        raise ApiError(400, f"{_cap(what)} is {err}; a request may nest at most {max_depth} levels.",
                       param=err.path or None) from None  # fmt: skip
    except safejson.NotText as err:
        raise ApiError(400, f"{_cap(what)}: {err}; send valid Unicode.", param=err.path or None) from None
    except safejson.NotFinite as err:
        raise ApiError(400, f"{_cap(what)} is not valid JSON: {err}.", param=err.path or None) from None
    except ValueError as err:
        raise ApiError(400, f"{_cap(what)} is not valid JSON: {_reason(err)}. Send one JSON object, UTF-8 encoded.") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"{_cap(what)} must be a JSON object, not {_kind(value)}.")
    return value


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _reason(err: ValueError) -> str:
    if isinstance(err, UnicodeDecodeError):
        return f"byte {err.start} is not UTF-8"
    return str(err)  # json.JSONDecodeError: "Expecting ',' delimiter: line 1 column 9 (char 8)"


def _kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
