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
from typing import Any

PREFIX = "/openai/"
# `/openai/v1/x`, `/openai/deployments/NAME/x` and `/openai/x` are serve's `/v1/x`.
_AZURE = re.compile(r"^/openai/(?:v1/|deployments/[^/]+/)?")


def moved(path: str) -> str:
    """Serve's `/v1` path for an Azure one."""
    return _AZURE.sub("/v1/", path, count=1)


class AzurePaths:
    """ASGI middleware: an Azure OpenAI call under `/openai` is routed as OpenAI's under `/v1`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PREFIX):
            raw = scope.get("raw_path") or scope["path"].encode()
            scope = dict(scope, path=moved(scope["path"]), raw_path=moved(raw.decode("latin-1")).encode("latin-1"))
        await self.app(scope, receive, send)
