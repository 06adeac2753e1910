"""The upstream endpoints the gateway forwards besides the two hot ones: an explicit
allow-list, each with the scope that keeps tenants apart. Anything else is 404.

    scope     what the gateway does                              endpoints
    shared    forwards as it is (no tenant's data in it)         models, embeddings, moderations,
                                                                 completions, count_tokens
    create    forwards, then records the new object's owner      POST files, batches, messages/batches
    owned     forwards only for the object's owner, else 404     GET/DELETE a file or its content,
                                                                 GET/cancel a batch (and results)
    list      the owner's objects only, from the gateway's       GET files, batches, messages/batches
              records, each read from the upstream

Paths are canonical by now (paths.py); an object id is one segment of plain characters.
Anthropic's `/v1/models` shares its path with OpenAI's and goes to the OpenAI upstream,
as every path outside `/v1/messages` does (errors.api_of).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Scope = Literal["shared", "create", "owned", "list"]
_ID = r"(?P<id>[A-Za-z0-9_-]{1,200})"
_MODEL = r"(?P<id>[A-Za-z0-9_.:-]{1,256})"


@dataclass(frozen=True, slots=True)
class Endpoint:
    method: str
    path: re.Pattern[str]
    api: str  # openai | anthropic: which upstream, and the error shape
    scope: Scope
    kind: str | None = None  # file | batch | message_batch: the object's kind
    shows: bool = False  # the answer is a batch object, looked at on its way back (scoped.py)
    # A batch's worth of input: passed on as it arrives (max_upload_bytes), never held whole.
    upload: bool = False


def _e(method: str, path: str, api: str, scope: Scope, kind: str | None = None, shows: bool = False,
       upload: bool = False) -> Endpoint:  # fmt: skip
    return Endpoint(method, re.compile(path + r"\Z"), api, scope, kind, shows, upload)


ENDPOINTS: tuple[Endpoint, ...] = (
    # OpenAI: stateless calls
    _e("GET", r"/v1/models", "openai", "shared"),
    _e("GET", rf"/v1/models/{_MODEL}", "openai", "shared"),
    _e("POST", r"/v1/embeddings", "openai", "shared"),
    _e("POST", r"/v1/moderations", "openai", "shared"),
    _e("POST", r"/v1/completions", "openai", "shared"),
    # OpenAI: files and batches, each its creator's
    _e("POST", r"/v1/files", "openai", "create", "file", upload=True),
    _e("GET", r"/v1/files", "openai", "list", "file"),
    _e("GET", rf"/v1/files/{_ID}", "openai", "owned", "file"),
    _e("GET", rf"/v1/files/{_ID}/content", "openai", "owned", "file"),
    _e("DELETE", rf"/v1/files/{_ID}", "openai", "owned", "file"),
    _e("POST", r"/v1/batches", "openai", "create", "batch", shows=True),
    _e("GET", r"/v1/batches", "openai", "list", "batch", shows=True),
    _e("GET", rf"/v1/batches/{_ID}", "openai", "owned", "batch", shows=True),
    _e("POST", rf"/v1/batches/{_ID}/cancel", "openai", "owned", "batch", shows=True),
    # Anthropic
    _e("POST", r"/v1/messages/count_tokens", "anthropic", "shared"),
    _e("POST", r"/v1/messages/batches", "anthropic", "create", "message_batch", shows=True, upload=True),
    _e("GET", r"/v1/messages/batches", "anthropic", "list", "message_batch", shows=True),
    _e("GET", rf"/v1/messages/batches/{_ID}", "anthropic", "owned", "message_batch", shows=True),
    _e("GET", rf"/v1/messages/batches/{_ID}/results", "anthropic", "owned", "message_batch"),
    _e("POST", rf"/v1/messages/batches/{_ID}/cancel", "anthropic", "owned", "message_batch", shows=True),
    _e("DELETE", rf"/v1/messages/batches/{_ID}", "anthropic", "owned", "message_batch"),
)  # fmt: skip


def match(method: str, path: str) -> tuple[Endpoint, str | None] | None:
    """(the endpoint, the object id in its path) for an allowed call, else None."""
    for endpoint in ENDPOINTS:
        if endpoint.method == method:
            m = endpoint.path.match(path)
            if m is not None:
                return endpoint, m.groupdict().get("id")
    return None
