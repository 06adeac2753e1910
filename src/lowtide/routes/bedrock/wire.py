"""What AWS Bedrock's batch inference takes and gives back, with no network (routes/bedrock/
batch.py talks to AWS): one input record per request, which models are served, and an
output record read into an `Outcome`.

An input record is `{"recordId": custom_id, "modelInput": body}`, where the body is what
Bedrock's InvokeModel takes for the job's model. For Anthropic Claude models that is a
Messages body (built by routes/anthropic/wire.py's `anthropic_params`: a messages body
verbatim, a chat body translated once) with `anthropic_version: bedrock-2023-05-31` and no
`model` (the job names the model). Other families (Amazon Nova and Titan, Meta Llama,
Mistral, Cohere, …) each take a body of their own that lowtide does not build: refused by
name, before anything is stored.

An output record (`{s3 out}/{job id}/{input name}.out`) is the input record with either
`modelOutput` (the InvokeModel answer: a Claude message) or `error` (`errorCode`,
`errorMessage`) beside it.
"""

from __future__ import annotations

import re
from typing import Any

from lowtide.core.endpoints import CHAT, MESSAGES
from lowtide.core.errors import RouteError
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.anthropic.wire import anthropic_outcome, anthropic_params, anthropic_refusal
from lowtide.routes.provider import retryable_status

ANTHROPIC_VERSION = "bedrock-2023-05-31"  # the one Bedrock's Claude models take
ENDPOINTS = (MESSAGES, CHAT)  # a chat body is translated to a Messages one (routes/anthropic/translate.py)
# A Claude model id, system inference profile (us./eu./apac./global.) or either's ARN.
_CLAUDE = re.compile(r"(^|[./:])anthropic\.claude")
# What Anthropic's Messages API takes that InvokeModel on Bedrock does not (UNCONFIRMED
# beyond these: Bedrock answers a field it does not know with a 400 for that record alone).
NOT_ON_BEDROCK = {"service_tier": "Bedrock's batch is its own tier",
                  "container": "Bedrock has no code-execution containers", "mcp_servers": "Bedrock has no MCP connector"}  # fmt: skip


def is_claude(model: str) -> bool:
    return bool(_CLAUDE.search(model))


def check_model(route: str, model: str) -> None:
    """Refuse a model whose body lowtide does not build for Bedrock, naming the fix."""
    if is_claude(model):
        return
    if ":application-inference-profile/" in model:
        raise RouteError(f"{route}: model {model!r} is an application inference profile, which does not say which model it "
                         "runs; give the Claude model id (anthropic.claude-…) or its system inference profile "
                         "(us.anthropic.claude-…), whose bodies lowtide builds")  # fmt: skip
    raise RouteError(f"{route}: model {model!r} is not an Anthropic Claude model; bedrock-batch builds Claude's Messages "
                     "bodies only (Amazon Nova and Titan, Meta Llama, Mistral, Cohere, … each take a body of their own). "
                     "Use a Claude model id (anthropic.claude-… or us.anthropic.claude-…), or another route for that model")  # fmt: skip


def refusal(request: Request, route: str) -> Refusal | None:
    """Why Bedrock's batch cannot take `request` as it is, or None."""
    if request.endpoint not in ENDPOINTS:
        return Refusal("endpoint", f"Bedrock's batch takes Claude Messages bodies here ({route}): {MESSAGES}, or {CHAT} "
                                   f"translated; not {request.endpoint}")  # fmt: skip
    refused = anthropic_refusal(request)
    if refused is not None:
        return refused
    params = anthropic_params(request)
    assert not isinstance(params, Refusal)  # anthropic_refusal said so first
    for key, why in NOT_ON_BEDROCK.items():
        if key in params:
            return Refusal(key, f"{why}; remove it")
    version = params.get("anthropic_version", ANTHROPIC_VERSION)
    if version != ANTHROPIC_VERSION:
        return Refusal("anthropic_version", f"Bedrock's Claude models take {ANTHROPIC_VERSION!r}, not {version!r}; "
                                            "remove it (lowtide writes Bedrock's)")  # fmt: skip
    return None


def model_input(request: Request) -> dict[str, Any]:
    """The record's `modelInput`: the Messages params, Bedrock's version first, no `model`."""
    params = anthropic_params(request)
    if isinstance(params, Refusal):  # the loader refuses these; a store from before it did, here
        raise ValueError(params.message("bedrock-batch"))
    body = {k: v for k, v in params.items() if k != "model"}
    return {"anthropic_version": body.pop("anthropic_version", ANTHROPIC_VERSION), **body}


def record(request: Request) -> dict[str, Any]:
    """One input line of a Bedrock batch file."""
    return {"recordId": request.custom_id, "modelInput": model_input(request)}


def outcome(line: dict[str, Any]) -> Outcome:
    """One output record as an Outcome. A record whose recordId is not text names no
    request: TypeError (the line is skipped, and its request retried)."""
    cid = line["recordId"]
    if not isinstance(cid, str):
        raise TypeError(f"recordId is {type(cid).__name__}, not text")
    output = line.get("modelOutput")
    if isinstance(output, dict) and "error" not in line:
        return anthropic_outcome(cid, output, batch=True)
    error = line.get("error") if isinstance(line.get("error"), dict) else {}
    status = error.get("errorCode")
    status = status if isinstance(status, int) and not isinstance(status, bool) else 500
    message = error.get("errorMessage") if isinstance(error.get("errorMessage"), str) else f"HTTP {status}"
    return Outcome.failure(cid, f"http_{status}", f"Bedrock: HTTP {status}: {message}", retryable_status(status))
