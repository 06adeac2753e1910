"""Deferred requests at the edge, both ways.

In: the call's body is stored as it came (DESIGN invariant 8): a flush's job reads it as a
`body_column` row, so every field, content part and parameter reaches the batch route
unchanged, or the route refuses it at the door (admission.py) and nothing is stored. The
keys read are `model` (for the model mapping; the one override) and `stream`: a streamed
call cannot wait (`deferred_body` says so), and `stream: false` asks for what a deferred
answer is anyway, so it is the one key removed.

Out: a finished lowtide request (a `requests` row) becomes what the API itself answered:
the provider's whole response body as the route kept it (`requests.response`) when it is in
the API's shape, or else (a row that kept no answer, or an answer of another protocol) a
`chat.completion` or `message` built from the answer text by the one answer builder
(`routes/replies.py`); a failure becomes the API's error body with the HTTP status it would have
had.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Row

from lowtide.core.endpoints import CHAT, MESSAGES
from lowtide.core.types import Refusal, Request, Usage
from lowtide.routes.replies import Ids, finish_of, in_shape, text_body
from lowtide.server.errors import ApiError
from lowtide.server.outputs import EXPIRED_CODES, HTTP_ERRORS, TIMEOUT_CODES

_dumps = json.JSONEncoder(ensure_ascii=False).encode
# The endpoint each hot path's calls are for: the flush's job endpoint.
ENDPOINT = {"openai": CHAT, "anthropic": MESSAGES}


def deferred_body(body: dict[str, Any]) -> dict[str, Any] | Refusal:
    """The body to store for a deferred call, or why this call cannot be deferred at all."""
    stream = body.get("stream")
    if stream is not None and stream is not False:
        return Refusal("stream", "a streamed call is answered now, not later")
    if stream is False and "stream_options" not in body:
        return {k: v for k, v in body.items() if k != "stream"}
    return body


def stored(body: dict[str, Any]) -> str:
    """A deferred request's `payload` column: `{"body": …}`, so the flush file's row is that
    text with its custom_id put in front (collector.py writes it without parsing it)."""
    return '{"body": ' + _dumps(body) + "}"


def flush_line(gid: str, payload: str, api: str, model: str) -> str:
    """One row of a flush's source file: `{"custom_id", "body"}`."""
    if not payload.startswith('{"body": '):  # accepted by a gateway before bodies were kept verbatim
        payload = stored(legacy_body(api, model, json.loads(payload)))
    return '{"custom_id": "' + gid + '", ' + payload[1:] + "\n"


def legacy_body(api: str, model: str, row: dict[str, Any]) -> dict[str, Any]:
    """The body a row stored by an older gateway stands for. Such a row holds what that
    gateway kept (text messages, max_tokens, temperature, stop): nothing more can be had.
    It wrote Anthropic's default temperature, 1.0, into every row; that one is left out (it
    asks for nothing the default does not, and Messages bodies do not declare it)."""
    messages = row.get("messages") or []
    params = {k: row[k] for k in ("max_tokens", "temperature") if row.get(k) is not None}
    if api == "anthropic":
        if params.get("temperature") == 1.0:
            del params["temperature"]
        system = "\n\n".join(m["content"] for m in messages if m.get("role") == "system")
        body = {"model": model, "messages": [m for m in messages if m.get("role") != "system"], **params}
        body.update({"system": system} if system else {})
        body.update({"stop_sequences": row["stop"]} if row.get("stop") else {})
        return body
    return {"model": model, "messages": messages, **params} | ({"stop": row["stop"]} if row.get("stop") else {})


def result_of(api: str, gid: str, model: str, r: Row, created: int) -> tuple[dict[str, Any], int]:
    """(response body in the API's shape, HTTP status) for a terminal `requests` row."""
    if r.state == "succeeded":
        endpoint = ENDPOINT[api]
        response = json.loads(r.response) if r.response else None
        if in_shape(endpoint, response):  # the provider's own answer, everything it returned
            return response, 200
        request = Request.from_payload(gid, json.loads(r.payload))
        usage = Usage(r.input_tokens or 0, r.cached_input_tokens or 0, r.cache_write_tokens or 0, r.output_tokens or 0,
                      r.reasoning_tokens or 0)  # fmt: skip
        finish = finish_of(response)
        if finish is None:  # a row that kept no answer: all of the limit used reads as cut
            limit = request.output_limit
            finish = "length" if limit and usage.output_tokens >= limit else "stop"
        asked = Request(gid, endpoint, dict(request.body))
        asked.model = model
        return _ran_as_batch(api, text_body(asked, r.output or "", finish, usage, ids=Ids(gid), created=created)), 200
    message = r.error_message or "the request failed"
    if r.error_code == "deadline_passed":  # the engine's words name a job and an operator's command, not the caller's
        message = "the request's deadline passed before it could be answered (neither its batch nor real time was in time)"
    if r.state == "cancelled":
        status, kind, code = 500, "server_error", "cancelled"
    elif r.error_code in EXPIRED_CODES:
        status, kind, code = 504, "timeout_error", r.error_code
    elif r.error_code in TIMEOUT_CODES:
        status, kind, code = 504, "timeout_error", "request_timeout"
    else:
        status, kind, code = HTTP_ERRORS.get(r.error_code, (500, "server_error", r.error_code))
    error = ApiError(status, message, type=kind if api == "openai" else None, code=code)
    return error.body(api), status


def _ran_as_batch(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """A message built here says the tier: the deferred call ran as a batch. (A route's own
    answer is returned as it came, with its own tier or none.)"""
    if api == "anthropic":
        body["usage"] = {"service_tier": "batch"} | body.get("usage", {})
    return body


def dumps(value: Any) -> str:
    return _dumps(value)
