"""HTTP errors in each provider's own shape.

OpenAI:    {"error": {"message", "type", "param", "code"}}
OpenRouter: {"error": {"code", "message"}}  (under /api/v1, OpenRouter's base path)
Anthropic: {"type": "error", "error": {"type", "message"}}
Gemini:    {"error": {"code", "message", "status"}}  (google.rpc.Status)

Paths under /v1/messages are Anthropic's, under /v1beta and /upload Gemini's, under /api/v1
OpenRouter's; every other path is OpenAI's.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
DEFAULT_MESSAGES = {
    429: "Rate limit reached for requests; try again later.",
    500: "The server had an error while processing your request. Sorry about that!",
    503: "The server is overloaded or not ready yet.",
    529: "Overloaded",
}


# Gemini's google.rpc status words by HTTP status.
GEMINI_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                 409: "ALREADY_EXISTS", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
                 501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}  # fmt: skip


def api_of(path: str) -> str:
    if path.startswith(("/v1beta/", "/upload/")):
        return "gemini"
    if path.startswith("/api/v1/"):  # OpenRouter's base path (openrouter_api.py)
        return "openrouter"
    return "anthropic" if path.startswith("/v1/messages") else "openai"


class ApiError(Exception):
    """An error answer. `type` and `code` default to what the provider uses for `status`."""

    def __init__(self, status: int, message: str, *, type: str | None = None, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers

    def body(self, api: str) -> dict[str, Any]:
        if api == "gemini":
            status = GEMINI_STATUS.get(self.status) or ("INTERNAL" if self.status >= 500 else "FAILED_PRECONDITION")
            return {"error": {"code": self.status, "message": self.message, "status": status}}
        if api == "openrouter":
            return {"error": {"code": self.status, "message": self.message}}
        if api == "anthropic":
            kind = self.type if self.type in ANTHROPIC_TYPES.values() else None
            kind = kind or ANTHROPIC_TYPES.get(self.status) or ("api_error" if self.status >= 500 else "invalid_request_error")
            return {"type": "error", "error": {"type": kind, "message": self.message}}
        kind, code = self.type, self.code
        if kind is None:
            if self.status == 429:
                kind, code = "requests", code or "rate_limit_exceeded"
            else:
                kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": code}}

    def response(self, api: str) -> JSONResponse:
        return JSONResponse(self.body(api), status_code=self.status, headers=self.headers)


def not_found(api: str, what: str, ident: str) -> ApiError:
    if api == "anthropic":
        return ApiError(404, f"{what} not found: {ident}")
    return ApiError(404, f"No {what} found with id '{ident}'.")


class HangUps(logging.Filter):
    """A client that hangs up mid-body is an everyday event, not a server error: its record
    becomes one INFO line, without the traceback a handler's `log.exception` would add."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ClientDisconnect):
            record.msg, record.args = f"{record.getMessage()}: the client hung up before its whole body arrived", ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


# The servers' loggers (serve's, the gateway's): where a handler may log a hang-up.
SERVER_LOGGERS = ("lowtide.serve", "lowtide.gateway")


def install(app: FastAPI) -> None:
    """Answer every error, ours and the framework's, in the caller's provider shape."""
    for name in SERVER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, HangUps) for f in logger.filters):
            logger.addFilter(HangUps())

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError) -> JSONResponse:
        return err.response(api_of(request.url.path))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        problems = []
        param = None
        for e in err.errors():
            loc = [str(p) for p in e["loc"] if p not in ("body", "query", "path")]
            param = param or ".".join(loc) or None
            problems.append(f"{'.'.join(loc) or 'body'}: {e['msg']}")
        return ApiError(400, "; ".join(problems), param=param).response(api_of(request.url.path))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, err: ClientDisconnect) -> JSONResponse:
        # Nobody reads this answer; without it the disconnect is logged as a server error.
        return ApiError(400, "The client disconnected before the whole body arrived.").response(api_of(request.url.path))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        message = str(err.detail) if err.status_code != 404 else f"Unknown path {request.method} {request.url.path}"
        return ApiError(err.status_code, message).response(api_of(request.url.path))
