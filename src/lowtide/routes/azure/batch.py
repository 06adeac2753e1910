"""`azure-batch`: Azure OpenAI Global Batch, OpenAI's Files + Batches API at an Azure resource.

The openai-batch route's code (routes/openai/batch.py) pointed at
`ENDPOINT/openai/v1/`: a JSONL file of request lines whose `model` is the *deployment name*,
uploaded with purpose `batch`, a batch created with completion window `24h` and the
dispatch's key in `metadata` (`lowtide_key`), found by it after a crash.

Client: the official `openai` SDK's `AsyncAzureOpenAI` at the resource's v1 base. Why: Azure
documents the v1 API (GA since August 2025) as current in 2026 — no dated `api-version` to
chase, and Global Batch serves its newest models only there — and `AzureOpenAI` is the SDK
class that sends the key the way Azure's v1 reference says a key is sent, in the `api-key`
header (plain `OpenAI` would send it as `Authorization: Bearer`, Azure's header for Entra ID
tokens). It adds `?api-version=v1`, which the v1 reference takes as its default.

What differs from OpenAI (learn.microsoft.com/azure/foundry/openai/how-to/batch; the card
`lowtide routes azure-batch` holds the figures):

- the base URL is the resource's own; `model` names a Global Batch deployment;
- limits per file: 100,000 requests, 200 MB (UNCONFIRMED: the v1 REST reference says 50,000);
- the queue limit is an enqueued-token quota *per deployment*, set in Azure, not published:
  `max_enqueued_tokens` (one number, or one per deployment, `*` for the rest) plans within
  it; a batch Azure still fails with `token_limit_exceeded` is sent again once batches in
  flight ended, as on openai-batch;
- Azure aims at 24 h and does not expire a job that takes longer: it runs until it ends or
  is cancelled (a job's `deadline` cancels it); a cancelled job returns what it finished.

Entra ID tokens are not supported yet: the route takes a key only.

Options: `endpoint` (https://RESOURCE.openai.azure.com; default: the environment variable
AZURE_OPENAI_ENDPOINT), `api_key_env` (AZURE_OPENAI_API_KEY), `api_version` (`v1`, or
`preview` for Azure's preview features), `max_requests`, `max_bytes`, `max_enqueued_tokens`,
and openai-batch's `poll_interval`, `find_hours`, `timeout`.
"""

from __future__ import annotations

import functools
import os
from typing import Any
from urllib.parse import urlsplit

import openai

from lowtide.core.cards import CARDS
from lowtide.core.errors import RouteError
from lowtide.core.types import Refusal, Request
from lowtide.routes.openai.batch import OpenAIBatchRoute, _queue_options
from lowtide.routes.openai.wire import openai_refusal
from lowtide.routes.options import text_option
from lowtide.routes.provider import check_options, is_loopback

NAME = "azure-batch"
CARD = CARDS[NAME]
ENDPOINT_ENV = "AZURE_OPENAI_ENDPOINT"  # the variable Azure's own samples and the SDK read
API_VERSIONS = ("v1", "preview")  # what the v1 API takes; a dated version is the legacy API's
OPTIONS = {"endpoint", "api_key_env", "api_version", "max_requests", "max_bytes", "max_enqueued_tokens",
           "poll_interval", "find_hours", "timeout"}  # fmt: skip


def v1_base(route: str, options: dict[str, Any]) -> str:
    """`ENDPOINT/openai/v1/` for the resource route_options.endpoint (or AZURE_OPENAI_ENDPOINT)
    names; one given with its `/openai` or `/openai/v1` already is taken as meant."""
    endpoint = text_option(route, options, "endpoint") or os.environ.get(ENDPOINT_ENV)
    if not endpoint:
        raise RouteError(
            f"{route}: no endpoint: give route_options.endpoint, your Azure OpenAI resource's "
            f"(https://RESOURCE.openai.azure.com), or set the environment variable {ENDPOINT_ENV}"
        )
    parts = urlsplit(endpoint.strip())
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.query or parts.fragment:
        raise RouteError(f"{route}: endpoint {endpoint!r} is not a resource's URL; give one like https://RESOURCE.openai.azure.com")
    if parts.scheme == "http" and not is_loopback(endpoint):  # the key travels in a header
        raise RouteError(f"{route}: endpoint {endpoint!r} is plain http: the key would cross the network unencrypted; give its https:// URL")
    path = parts.path.rstrip("/").removesuffix("/v1").removesuffix("/openai")
    return f"{parts.scheme}://{parts.netloc}{path}/openai/v1/"


class AzureBatchRoute(OpenAIBatchRoute):
    name = NAME

    def __init__(self, options: dict[str, Any]):
        check_options(self.name, options, OPTIONS)
        base_url = v1_base(self.name, options)
        version = options.get("api_version", "v1")
        if version not in API_VERSIONS:
            raise RouteError(
                f"{self.name}: route_options.api_version {version!r}: this route speaks Azure's v1 API, which takes "
                f"{' or '.join(API_VERSIONS)}; a dated version (2024-10-21) is the legacy API's: leave api_version out"
            )
        self.tier = None  # OpenAI's usage tiers are not Azure's
        self.max_enqueued_tokens = _queue_options(self.name, {"max_enqueued_tokens": options.get("max_enqueued_tokens")})[1]
        wire = CARD.wire
        assert wire is not None and wire.auth == "api-key"
        self.purpose = wire.purpose
        self.completion_window = wire.completion_window
        self.send_metadata = wire.metadata
        # The key goes in Azure's `api-key` header; the SDK sends nothing else of it.
        client = functools.partial(openai.AsyncAzureOpenAI, api_version=version)
        self.setup(options, CARD, wire.key_env, base_url, client)  # type: ignore[arg-type]

    def refusal(self, request: Request) -> Refusal | None:
        refused = openai_refusal(request, self.name)
        if refused is None and request.endpoint not in CARD.endpoints:
            return Refusal("endpoint", f"Azure OpenAI Global Batch takes {', '.join(CARD.endpoints)} ({self.name}), "
                                       f"not {request.endpoint}; use another route for this endpoint")  # fmt: skip
        return refused


def create(options: dict[str, Any]) -> AzureBatchRoute:
    return AzureBatchRoute(options)
