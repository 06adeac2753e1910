"""Vertex AI batch prediction's lines, with no network: what a request is written as, how
its answer is matched back, and what Vertex's `GenerateContentRequest` cannot take.

An input line is `{"request": GenerateContentRequest}` (Gemini's body, its model left out:
the job names it). Vertex's JSONL lines carry no key of the caller's, but each output line
carries its `request` back beside its `response` (or its error, in `status`), so the
custom_id rides inside the request, in its `labels` (a field Vertex's GenerateContentRequest
declares, "user-defined metadata for the request"). A label value takes only lowercase
letters, digits, `_` and `-`, at most 63 characters: the custom_id is written in base32
(lowercase, unpadded), 63 characters a label, as `lowtide_id`, `lowtide_id_1`, … (LiteLLM
matches Vertex's lines the same way, by a label). A request's own labels travel with them;
one that uses a `lowtide_id` key, or leaves no room under Vertex's 64 labels, is refused.

    {"request": {"contents": [...], "labels": {"lowtide_id": "kqydamzr"}}}          (in)
    {"status": "", "processed_time": "…", "request": {… the same …}, "response": {…}}  (out)
    {"status": "Bad Request: {\"error\": {\"code\": 400, …}}", "request": {…}}          (out, failed)
"""

from __future__ import annotations

import base64
import json
from typing import Any

from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.gemini.names import named_body
from lowtide.routes.gemini.wire import RETRYABLE_STATUS, gemini_error, gemini_outcome

LABEL = "lowtide_id"  # the first label the custom_id is written in; the rest are LABEL_1, LABEL_2, …
LABEL_CHARS = 63  # Vertex: a label value has at most 63 characters
MAX_LABELS = 64  # Vertex: a request carries at most 64 labels
# The fields of Vertex's GenerateContentRequest (v1 REST reference); the Gemini API's own
# `serviceTier`, `store` and `continuationToken` are not among them.
VERTEX_KEYS = frozenset({"model", "contents", "systemInstruction", "cachedContent", "tools", "toolConfig", "labels",
                         "safetySettings", "generationConfig", "modelArmorConfig"})  # fmt: skip


def id_labels(custom_id: str) -> dict[str, str]:
    """The labels `custom_id` is written in."""
    code = base64.b32encode(custom_id.encode("utf-8", "surrogatepass")).decode().rstrip("=").lower()
    chunks = [code[i : i + LABEL_CHARS] for i in range(0, len(code), LABEL_CHARS)] or [""]
    return {LABEL if i == 0 else f"{LABEL}_{i}": chunk for i, chunk in enumerate(chunks)}


def custom_id_of(labels: Any) -> str | None:
    """The custom_id a request's labels carry, or None (labels lowtide did not write)."""
    if not isinstance(labels, dict) or not isinstance(labels.get(LABEL), str):
        return None
    chunks, i = [labels[LABEL]], 1
    while isinstance(labels.get(f"{LABEL}_{i}"), str):
        chunks.append(labels[f"{LABEL}_{i}"])
        i += 1
    code = "".join(chunks).upper()
    try:
        return base64.b32decode(code + "=" * (-len(code) % 8)).decode("utf-8", "surrogatepass")
    except ValueError:
        return None


def refusal(request: Request, route: str) -> Refusal | None:
    """Why Vertex's batch cannot take `request` as it is, or None."""
    body = named_body(request, route)  # Gemini's own checks, and a chat body translated once
    if isinstance(body, Refusal):
        return body
    return _vertex_refusal(body, request.custom_id)


def _vertex_refusal(body: dict[str, Any], custom_id: str) -> Refusal | None:
    for key in body:
        if key not in VERTEX_KEYS:
            return Refusal(key, "is not a field of Vertex AI's GenerateContentRequest (a Gemini API field Vertex does not "
                                "take); remove it, or use the gemini-batch route")  # fmt: skip
    labels = body.get("labels")
    if labels is None:
        return None
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        return Refusal("labels", "must map label keys to text values")
    ours = [k for k in labels if k == LABEL or k.startswith(f"{LABEL}_")]
    if ours:
        return Refusal(f"labels.{ours[0]}", "is the label lowtide carries the custom_id in (Vertex's lines have no key "
                                            "field); rename your label")  # fmt: skip
    if len(labels) + len(id_labels(custom_id)) > MAX_LABELS:
        return Refusal("labels", f"{len(labels)} labels leave no room for the {len(id_labels(custom_id))} that carry the "
                                 f"custom_id (Vertex takes {MAX_LABELS} a request); drop some, or shorten the custom_id")  # fmt: skip
    return None


def request_line(request: Request, route: str) -> dict[str, Any] | Refusal:
    """One input line: the body without its model (the job's), its custom_id in its labels."""
    body = named_body(request, route)
    if isinstance(body, Refusal):
        return body
    refused = _vertex_refusal(body, request.custom_id)
    if refused is not None:
        return refused
    sent = {k: v for k, v in body.items() if k != "model"}
    sent["labels"] = {**(body.get("labels") or {}), **id_labels(request.custom_id)}
    return {"request": sent}


def parse_output_line(line: Any) -> Outcome:
    """One line of `predictions.jsonl`. A line whose request carries no custom_id names no
    request: TypeError (the line is skipped, and its request counts as unanswered)."""
    if not isinstance(line, dict):
        raise TypeError(f"a line is {type(line).__name__}, not an object")
    request = line.get("request")
    custom_id = custom_id_of(request.get("labels") if isinstance(request, dict) else None)
    if custom_id is None:
        raise TypeError("its request carries no lowtide_id label")
    status = line.get("status")
    if isinstance(line.get("response"), dict) and not status:
        return gemini_outcome(custom_id, line["response"], batch=True)
    return status_outcome(custom_id, status)


def status_outcome(custom_id: str, status: Any) -> Outcome:
    """A failed line's `status`: a google.rpc.Status, or text such as `Bad Request: {"error":
    {"code", "message", "status"}}` (its JSON read where it holds some), kept whole as the message."""
    if isinstance(status, dict):
        return gemini_error(custom_id, status.get("error", status))
    text = status if isinstance(status, str) and status else "Vertex AI gave no response and no status for this request"
    found = _embedded_error(text)
    if found is not None:
        outcome = gemini_error(custom_id, found)
        outcome.error_message = text  # everything the provider said
        return outcome
    word = next((s for s in RETRYABLE_STATUS if s in text), None)
    return Outcome.failure(custom_id, word.lower() if word else "vertex_error", text, word is not None)


def _embedded_error(text: str) -> dict[str, Any] | None:
    start = text.find("{")
    if start < 0:
        return None
    try:
        data = json.loads(text[start:])
    except ValueError:
        return None
    error = data.get("error", data) if isinstance(data, dict) else None
    return error if isinstance(error, dict) and ("code" in error or "status" in error) else None
