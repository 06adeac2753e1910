"""Taking a Gemini batch's requests in: from the inline list at create (gemini_api.py), or
from an uploaded JSONL file of `{"key", "request"}` lines by the worker (lifecycle.py), into
the batch's folder as lowtide source rows (intake.py). A request the backend refuses is kept
as that key's error; a line that is no request refuses the whole batch (ApiError, its words).

An inline request's key is its `metadata.key` when that is text, else a private one no key of
the batch has; the batch's keys and each request's own `metadata` are kept in order
(`ORDER`), for its responses to come back in the requests' order with their metadata."""

from __future__ import annotations

from typing import Any

from lowtide.core import fastjson
from lowtide.core.endpoints import GEMINI
from lowtide.server import safejson
from lowtide.server.context import Server
from lowtide.server.errors import ApiError
from lowtide.server.finalize import batch_folder
from lowtide.server.gemini_files import get_file
from lowtide.server.intake import Intake
from lowtide.server.translate import rejection

ORDER = "order.jsonl"  # an inline batch's requests in order: `[key, metadata or null]` a line


def _given_key(item: Any) -> str | None:
    meta = item.get("metadata") if isinstance(item, dict) else None
    return meta.get("key") if isinstance(meta, dict) and isinstance(meta.get("key"), str) else None


def _private_key(i: int, given: set[str]) -> str:
    """The key of the `i`th request, sent without one: `~<i>`, with one more `~` while a
    request's own key is that (so none is refused as a duplicate, as Gemini refuses none)."""
    key = f"~{i}"
    while key in given:
        key = "~" + key
    return key


def _inline_items(given: list[Any]):
    keys = [_given_key(item) for item in given]
    taken = {k for k in keys if k is not None}
    for i, (item, key) in enumerate(zip(given, keys, strict=True)):
        request = item.get("request") if isinstance(item, dict) else None
        meta = item.get("metadata") if isinstance(item, dict) else None
        yield f"requests[{i}]", key if key is not None else _private_key(i, taken), request, meta


def _items(server: Server, source: dict[str, Any]):
    """(where, key, request, metadata) of each request, in order, or the 400 for the first
    that is no request. A file's lines have no metadata (None)."""
    if "requests" in source:
        given = (source.get("requests") or {}).get("requests") if isinstance(source.get("requests"), dict) else None
        if not isinstance(given, list):
            raise ApiError(400, "batch.inputConfig.requests.requests: expected a list of requests.")
        yield from _inline_items(given)
        return
    name = source.get("fileName")
    if not isinstance(name, str):
        raise ApiError(400, "batch.inputConfig: give fileName (an uploaded JSONL file) or requests.")
    file = get_file(server, name)
    with server.path(file.path).open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = safejson.loads(line, server.config.max_json_depth)
            except ValueError as err:
                raise ApiError(400, f"{name} line {n}: not valid JSON ({err}).") from None
            if not isinstance(data, dict) or not isinstance(data.get("key"), str):
                raise ApiError(400, f'{name} line {n}: expected {{"key": "...", "request": {{...}}}}.')
            yield f"{name} line {n}", data["key"], data.get("request"), None


def take(server: Server, batch_id: str, model: str, source: dict[str, Any]) -> Intake:
    seen: set[str] = set()
    inline = "requests" in source
    with Intake(batch_folder(server, batch_id), batch_id) as intake:
        order = (intake.folder / ORDER).open("wb") if inline else None
        try:
            for where, key, asked, meta in _items(server, source):
                if key in seen:
                    raise ApiError(400, f"{where}: key '{key}' is used more than once; each request needs its own.")
                seen.add(key)
                if order is not None:
                    order.write(fastjson.dumpb([key, meta]) + b"\n")
                if not isinstance(asked, dict):
                    raise ApiError(400, f"{where}: request: expected a GenerateContentRequest object.")
                refused = rejection(server.route, GEMINI, asked | {"model": model}, server.config.model, "gemini")
                intake.add(key, model, refused or {"body": asked})
        except BaseException:
            intake.discard()
            raise
        finally:
            if order is not None:
                order.close()
    return intake
