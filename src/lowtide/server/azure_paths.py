"""Azure OpenAI's paths, one surface with OpenAI's: the `openai` SDK's `AzureOpenAI` (and
`OpenAI` pointed at a resource's `/openai/v1/`) talk to `lowtide serve` at its defaults.

Azure serves OpenAI's API under `/openai`: the v1 API at `/openai/v1/…` (`?api-version=v1`
optional), the dated API at `/openai/…?api-version=2024-10-21`, with a deployment's calls at
`/openai/deployments/{name}/chat/completions`. This middleware moves each onto serve's own
`/v1/…` path before anything else sees it (the guard's upload paths, the key check, the fault
plan, the routing), so Files, Batches and real time answer under both prefixes alike. The
`api-version` parameter is taken and not checked: serve has one version of each API. The key
may come in Azure's `api-key` header (server/app.py's key check reads it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

PREFIX = "/openai/"
# `/openai/v1/x`, `/openai/deployments/NAME/x` and `/openai/x` are serve's `/v1/x`.
_AZURE = re.compile(r"^/openai/(?:v1/|deployments/[^/]+/)?")


def moved(path: str) -> str:
    """Serve's `/v1` path for an Azure one."""
    return _AZURE.sub("/v1/", path, count=1)


class MovedPaths:
    """ASGI middleware: a call whose path starts with `prefix` is routed as `moved(path)`
    (Azure's here; Mistral's in mistral_api.py)."""

    def __init__(self, app: Any, prefix: str = PREFIX, moved: Callable[[str], str] = moved) -> None:
        self.app, self.prefix, self.moved = app, prefix, moved

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.prefix):
            raw = scope.get("raw_path") or scope["path"].encode()
            scope = dict(scope, path=self.moved(scope["path"]), raw_path=self.moved(raw.decode("latin-1")).encode("latin-1"))
        await self.app(scope, receive, send)
