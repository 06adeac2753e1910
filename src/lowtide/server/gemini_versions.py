"""Gemini's two API versions, one surface here. google-genai calls `/v1/…` by default
(`GOOGLE_AI_API_DEFAULT_VERSION`) and `/v1beta/…` when asked; serve answers Gemini under
`/v1beta` (gemini_api.py, gemini_files.py), and this middleware moves a Gemini call on `/v1`
there before anything else sees it, so routing, error shapes, auth and the fault plan treat
both versions alike. The version called is kept in `request.state.gemini_version`, so the
URIs serve hands back (a file's `uri`, the upload URL) stay on it.

OpenAI's API shares the `/v1` prefix, and two of its paths have Gemini twins:
`/v1/files[/{id}]` and `/v1/batches[/{id}]`. A `/v1` call is taken as Gemini's when

- its path is one only Gemini has: `/upload/v1/…`, or a last segment naming one of
  Gemini's methods (`models/m:batchGenerateContent`, `batches/b:cancel`,
  `files/f:download`; an OpenAI fine-tuned model's id holds colons too, but never ends in
  one of these names);
- or, on the shared paths, it carries what google-genai always sends and OpenAI's and
  Anthropic's SDKs never do: the `x-goog-api-key` or `x-goog-api-client` header, or `?key=`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

GEMINI_HEADERS = (b"x-goog-api-key", b"x-goog-api-client")
# The custom methods of Gemini's resources (`name:method`) in its REST reference.
GEMINI_METHODS = frozenset({
    "generateContent", "streamGenerateContent", "batchGenerateContent", "countTokens", "embedContent",
    "batchEmbedContents", "asyncBatchEmbedContent", "predict", "predictLongRunning", "cancel", "download",
    "updateGenerateContentBatch", "updateEmbedContentBatch",
})  # fmt: skip


def is_gemini(path: str, headers: list[tuple[bytes, bytes]], query: bytes) -> bool:
    """Whether a call on a `/v1` path is Gemini's (see the module's docstring)."""
    if path.startswith("/upload/v1/"):
        return True
    if path.startswith("/v1/messages"):
        return False  # Anthropic's, whatever it carries
    last = path.rsplit("/", 1)[-1]
    if ":" in last and last.rsplit(":", 1)[-1] in GEMINI_METHODS:
        return True
    if any(name in GEMINI_HEADERS for name, _ in headers):
        return True
    return "key" in parse_qs(query.decode("latin-1"))


def moved(path: str) -> str:
    """The `/v1beta` path of a Gemini call on `/v1` (the path as it came, or decoded)."""
    if path.startswith("/upload/v1/"):
        return "/upload/v1beta/" + path.removeprefix("/upload/v1/")
    return "/v1beta/" + path.removeprefix("/v1/")


class GeminiVersions:
    """ASGI middleware: a Gemini call on `/v1` is routed as the same call on `/v1beta`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            version = "v1beta" if path.startswith(("/v1beta/", "/upload/v1beta/")) else None
            if path.startswith(("/v1/", "/upload/v1/")) and is_gemini(path, scope["headers"], scope.get("query_string", b"")):
                version = "v1"
                raw = scope.get("raw_path") or path.encode()
                scope = dict(scope, path=moved(path), raw_path=moved(raw.decode("latin-1")).encode("latin-1"))
            if version is not None:
                scope = dict(scope, state={**scope.get("state", {}), "gemini_version": version})
        await self.app(scope, receive, send)


def version_of(request: Any) -> str:
    """The Gemini version a request called (`v1beta` when the middleware did not say)."""
    return getattr(request.state, "gemini_version", "v1beta")
