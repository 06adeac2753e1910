"""One capability card per route: what a provider allows and keeps, as data in one place.

    CARDS[route] ─► routes    limits a batch is planned within (routes/provider.py), the states
                              a poll reads as ended, the metadata key a batch is found by
                  ─► core     how a route bills (pricing.py), the endpoint a spec defaults to
                              (spec.py), which routes carry bodies verbatim (params.py)
                  ─► engine   turnaround priors for `route: auto` (engine/turnaround.py)
                  ─► cli      `lowtide routes` (`--json`), and docs/support.md (routes/support.py)

A figure comes from the provider's own documentation as compiled in
shared/reference/batch-apis.md, or from lowtide's own code for its own routes; one that no
primary source settled is named in the card's `unconfirmed` (its dotted field), never
invented: None means "not known here". A route option may make a limit tighter, never
looser (`check_limit`). A plugin route has no card: code reading one falls back to its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lowtide.core.endpoints import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    GEMINI,
    MESSAGES,
    MODERATIONS,
    RESPONSES,
)
from lowtide.core.errors import RouteError

MB = 2**20
HOUR = 3600
DAY = 86400

# What a provider's word for a batch's state means to lowtide.
Meaning = Literal["running", "cancelling", "ended", "failed", "expired", "cancelled"]
ENDED_MEANINGS = frozenset({"ended", "failed", "expired", "cancelled"})


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Limits(_Frozen):
    """Per batch, at the provider; None: no such limit, or not known (see `unconfirmed`)."""

    max_requests: int | None = None
    max_bytes: int | None = None  # one batch's input: its file, or its create call's body
    inline_bytes: int | None = None  # a batch sent inline rather than as an uploaded file
    min_requests: int | None = None
    custom_id_max: int | None = None  # characters
    custom_id_pattern: str | None = None
    enqueued_tokens: str | None = None  # how the provider's queue limits apply, and where lowtide keeps them
    one_model_per_batch: bool = False
    one_endpoint_per_batch: bool = False
    metadata: str | None = None  # what a batch may carry of the caller's own


class Lines(_Frozen):
    """The shape of one request line in a batch and the key its result is matched by."""

    input: str
    result_key: str
    order: str = "any: results are matched by their key, never by position"


class Recovery(_Frozen):
    """How a batch is found after a crash between its create and recording its id (DESIGN 3)."""

    how: Literal["metadata", "display_name", "idempotency_key", "match", "local", "none"]
    field: str | None = None  # where the dispatch's key travels
    note: str = ""


class Retention(_Frozen):
    """How long the provider keeps a batch's parts; seconds, None where not known."""

    window_s: int | None = None  # a batch still running after this is expired by the provider
    inputs_s: int | None = None
    results_s: int | None = None
    note: str = ""


class Ends(_Frozen):
    """What a batch that did not finish keeps."""

    expired: str | None  # None: not known (see `unconfirmed`)
    cancelled: str | None


class Discount(_Frozen):
    factor: Decimal | None  # the share of the real-time price paid
    stacks_with_cache: bool | None  # whether prompt-cache prices are discounted too
    source: str


class Privacy(_Frozen):
    residency: str | None = None  # where the data is processed
    zero_retention: bool | None = None  # whether the route is eligible for zero data retention
    note: str = ""


class Prior(_Frozen):
    """A turnaround to assume until this store has measured the route (engine/turnaround.py)."""

    p50: float
    p95: float
    per_request: bool  # seconds per request (direct routes) or per batch
    source: str


class Wire(_Frozen):
    """How a route speaking OpenAI's Files + Batches API reaches one provider: what differs
    between the providers that speak it (a profile of `openai-compatible-batch`, `azure-batch`)."""

    base_url: str | None  # None: route_options.base_url must give it
    key_env: str  # the environment variable the key is read from, by default
    auth: Literal["bearer", "api-key"] = "bearer"  # `Authorization: Bearer KEY`, or Azure's `api-key: KEY`
    purpose: str = "batch"  # the upload's `purpose`
    completion_window: str = "24h"
    metadata: bool = True  # whether a batch carries `metadata` (the dispatch's key, to be found by)


class Card(_Frozen):
    name: str
    kind: Literal["batch", "direct"]
    provider: str  # in words: who runs the requests
    # The protocol whose bodies the route sends to its provider as they came (a body of
    # another protocol is translated or refused); None: lowtide's own engine runs them.
    protocol: Literal["openai", "anthropic", "gemini"] | None
    # the price list (core/pricing.py); lowtide has none for groq, together, azure's own prices
    billing: Literal["openai", "anthropic", "google", "groq", "together", "novita", "doubleword", "azure", "openrouter", "mistral",
                     "aws"] | None
    tier: Literal["realtime", "batch", "self_hosted", "free"]
    endpoints: tuple[str, ...]  # those the provider takes (in a batch, for a batch route)
    limits: Limits = Limits()
    lines: Lines | None = None
    recovery: Recovery | None = None
    retention: Retention = Retention()
    ends: Ends | None = None
    status: dict[str, Meaning] = {}
    discount: Discount | None = None
    privacy: Privacy = Privacy()
    turnaround: Prior | None = None
    tier_turnaround: dict[str, Prior] = {}  # by `route_options.service_tier`
    wire: Wire | None = None  # for routes that speak OpenAI's Batch API to more than one provider
    unconfirmed: tuple[str, ...] = ()  # dotted fields no primary source settled
    sources: tuple[str, ...] = ()

    def ended_states(self) -> frozenset[str]:
        """The provider's words for a batch that will change no more."""
        return frozenset(s for s, meaning in self.status.items() if meaning in ENDED_MEANINGS)


def check_limit(route: str, key: str, value: int, limit: int | None, what: str) -> int:
    """A route option that sets a per-batch limit (`max_requests`, `max_bytes`, …), checked
    against the card's: tighter is kept, looser is refused naming the provider, the limit
    and the fix (the provider would refuse the batch, after its upload)."""
    card = CARDS.get(route)
    if limit is None or value <= limit:
        return value
    field = f"limits.{key}"  # the option and the card field share the name
    # a limit no provider document settles is lowtide's own bound, and said to be
    whose = f"{card.provider}'s limit" if card and field not in card.unconfirmed else "lowtide's bound"
    raise RouteError(
        f"{route}: route_options.{key} is {value:,}, over {whose} of {limit:,} {what} a batch; "
        f"give at most {limit:,}, or leave route_options.{key} out to use the limit"
    )


def card_of(route: str, options: Mapping[str, Any] | None = None) -> Card | None:
    """The route's card, or its profile's (`route_options.profile`: `ROUTE:PROFILE`); None for
    a route lowtide does not ship (a plugin)."""
    return CARDS.get(card_name(route, options))


def card_name(route: str, options: Mapping[str, Any] | None = None) -> str:
    """The card a route with these options runs by: `ROUTE:PROFILE` where the route has profiles."""
    profile = (options or {}).get("profile")
    return f"{route}:{profile}" if isinstance(profile, str) and f"{route}:{profile}" in CARDS else route


def profiles_of(route: str) -> tuple[str, ...]:
    """The profiles a route takes in `route_options.profile`."""
    return tuple(n.split(":", 1)[1] for n in CARDS if n.startswith(f"{route}:"))


def routes_of(protocol: str) -> tuple[str, ...]:
    """The routes that carry `protocol`'s bodies verbatim to a provider of that protocol."""
    return tuple(n for n, c in CARDS.items() if c.protocol == protocol)


_OPENAI_BATCH_STATUS: dict[str, Meaning] = {
    "validating": "running", "in_progress": "running", "finalizing": "running", "completed": "ended",
    "failed": "failed", "expired": "expired", "cancelling": "cancelling", "cancelled": "cancelled",
}  # fmt: skip
_REALTIME = "about 8-30 s a request, 16 in flight"
_DIRECT_RETENTION = Retention(note="nothing is kept for lowtide: each answer comes back on the call that asked")
_ANTHROPIC_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
_OPENAI_LINES = Lines(input='{"custom_id", "method": "POST", "url", "body"} per JSONL line', result_key="custom_id")
_OPENAI_RECOVERY = Recovery(how="metadata", field="metadata.lowtide_key",
                            note="find lists recent batches (route_options.find_hours, 48) and adopts the one with the key")

CARDS: dict[str, Card] = {
    "openai-batch": Card(
        name="openai-batch", kind="batch", provider="OpenAI", protocol="openai", billing="openai", tier="batch",
        endpoints=(RESPONSES, CHAT, EMBEDDINGS, COMPLETIONS, MODERATIONS),
        limits=Limits(
            max_requests=50_000, max_bytes=200 * MB, min_requests=1, one_model_per_batch=True, one_endpoint_per_batch=True,
            enqueued_tokens="per model and usage tier (core/batch_limits.py); route_options.tier or max_enqueued_tokens",
            metadata="16 pairs, keys ≤ 64 characters, values ≤ 512",
        ),
        lines=Lines(input='{"custom_id", "method": "POST", "url", "body"} per JSONL line', result_key="custom_id"),
        recovery=Recovery(how="metadata", field="metadata.lowtide_key",
                          note="find lists recent batches (route_options.find_hours, 48) and adopts the one with the key"),
        retention=Retention(window_s=24 * HOUR, results_s=30 * DAY,
                            note="output files are deleted after 30 days; input files keep until deleted, or `expires_after`"),
        ends=Ends(expired="finished requests are in the output file (billed); the rest come back as batch_expired lines",
                  cancelled="cancelling takes up to ~10 min; partial results are in the output file"),
        status=_OPENAI_BATCH_STATUS,
        discount=Discount(factor=Decimal("0.5"), stacks_with_cache=None, source="OpenAI Batch API: 50% of the synchronous price"),
        turnaround=Prior(p50=4 * HOUR, p95=24 * HOUR, per_request=False, source="OpenAI: completion window 24 h, no typical time published"),
        unconfirmed=("limits.custom_id_max", "retention.inputs_s", "discount.stacks_with_cache", "privacy.residency", "privacy.zero_retention"),
        sources=("platform.openai.com/docs/guides/batch", "openai/openai-openapi openapi.yaml"),
    ),
    "anthropic-batch": Card(
        name="anthropic-batch", kind="batch", provider="Anthropic", protocol="anthropic", billing="anthropic", tier="batch",
        endpoints=(MESSAGES,),
        limits=Limits(max_requests=100_000, max_bytes=256 * MB, min_requests=1, custom_id_max=64,
                      custom_id_pattern=_ANTHROPIC_PATTERN, metadata="none: a batch carries nothing of the caller's"),
        lines=Lines(input='{"custom_id", "params"} per entry of the create call\'s `requests`', result_key="custom_id"),
        recovery=Recovery(how="match", note="no metadata: a batch of the dispatch's size created in its window "
                          "(route_options.find_window, 600 s) is adopted once ended and holding only its custom_ids"),
        retention=Retention(window_s=24 * HOUR, results_s=29 * DAY, note="results stay available 29 days"),
        ends=Ends(expired="finished requests keep their results; the rest are `expired` results, not billed",
                  cancelled="finished requests keep their results; the rest are `canceled` results, not billed"),
        status={"in_progress": "running", "canceling": "cancelling", "ended": "ended"},
        discount=Discount(factor=Decimal("0.5"), stacks_with_cache=True,
                          source="Anthropic Message Batches: 50% of standard, stacking with prompt caching"),
        turnaround=Prior(p50=HOUR, p95=24 * HOUR, per_request=False, source="Anthropic: most batches finish in less than 1 h, all within 24 h"),
        unconfirmed=("retention.inputs_s", "privacy.residency", "privacy.zero_retention"),
        sources=("docs.anthropic.com/en/docs/build-with-claude/batch-processing", "anthropic-sdk-python"),
    ),
    "gemini-batch": Card(
        name="gemini-batch", kind="batch", provider="Google", protocol="gemini", billing="google", tier="batch",
        endpoints=(GEMINI,),
        limits=Limits(max_requests=100_000, max_bytes=2048 * MB, inline_bytes=20 * MB, min_requests=1, one_model_per_batch=True,
                      metadata="a display name (the dispatch's key)"),
        lines=Lines(input='{"key", "request"} per JSONL line (inline: each request\'s metadata.key)', result_key="key"),
        recovery=Recovery(how="display_name", field="displayName",
                          note="find reads recent batches (route_options.find_pages, 10 pages of 100) for the key"),
        retention=Retention(window_s=48 * HOUR, note="a batch still pending or running after 48 h is expired"),
        ends=Ends(expired=None, cancelled=None),
        status={"JOB_STATE_PENDING": "running", "JOB_STATE_RUNNING": "running", "JOB_STATE_SUCCEEDED": "ended",
                "JOB_STATE_FAILED": "failed", "JOB_STATE_CANCELLED": "cancelled", "JOB_STATE_EXPIRED": "expired"},
        discount=Discount(factor=Decimal("0.5"), stacks_with_cache=None, source="Gemini Batch Mode: 50% of the standard cost"),
        unconfirmed=("limits.max_requests", "limits.custom_id_max", "retention.inputs_s", "retention.results_s", "ends.expired",
                     "ends.cancelled", "discount.stacks_with_cache", "privacy.residency", "privacy.zero_retention", "turnaround"),
        sources=("ai.google.dev/gemini-api/docs/batch-mode", "googleapis/python-genai batches.py"),
    ),
    # `openai-compatible-batch`: OpenAI's Files + Batches API at another provider, one card per
    # `route_options.profile` (routes/openai/compatible_batch.py); without a profile, any server
    # speaking it at route_options.base_url, within OpenAI's limits as lowtide's own bound.
    "openai-compatible-batch": Card(
        name="openai-compatible-batch", kind="batch", provider="any server speaking OpenAI's Batch API (route_options.base_url)",
        protocol="openai", billing=None, tier="self_hosted", endpoints=(CHAT, RESPONSES, COMPLETIONS, EMBEDDINGS),
        limits=Limits(max_requests=50_000, max_bytes=200 * MB, min_requests=1, one_model_per_batch=True, one_endpoint_per_batch=True),
        lines=_OPENAI_LINES, recovery=_OPENAI_RECOVERY, status=_OPENAI_BATCH_STATUS,
        retention=Retention(note="whatever the server keeps"), privacy=Privacy(residency="wherever route_options.base_url points"),
        wire=Wire(base_url=None, key_env="OPENAI_API_KEY"),
        unconfirmed=("limits.max_requests", "limits.max_bytes"),
    ),
    "openai-compatible-batch:groq": Card(
        name="openai-compatible-batch:groq", kind="batch", provider="Groq", protocol="openai", billing="groq", tier="batch",
        endpoints=(CHAT,),
        limits=Limits(max_requests=50_000, max_bytes=100 * MB, min_requests=1, one_model_per_batch=True, one_endpoint_per_batch=True,
                      metadata="a metadata mapping (the groq SDK's batches.create takes one)"),
        lines=_OPENAI_LINES, recovery=_OPENAI_RECOVERY, status=_OPENAI_BATCH_STATUS,
        retention=Retention(window_s=24 * HOUR, note="completion_window 24h (Groq takes 24h to 7d)"),
        discount=Discount(factor=Decimal("0.75"), stacks_with_cache=None, source="console.groq.com/docs/batch: 25% lower cost than the synchronous API"),
        turnaround=Prior(p50=4 * HOUR, p95=24 * HOUR, per_request=False, source="Groq: a 24-hour processing window, no typical time published"),
        wire=Wire(base_url="https://api.groq.com/openai/v1", key_env="GROQ_API_KEY"),
        unconfirmed=("limits.max_requests", "limits.max_bytes", "limits.custom_id_max", "limits.one_model_per_batch", "retention.inputs_s",
                     "retention.results_s", "ends.expired", "ends.cancelled", "discount.stacks_with_cache", "privacy.residency",
                     "privacy.zero_retention"),
        sources=("console.groq.com/docs/batch", "groq-python resources/batches.py (POST /openai/v1/batches)"),
    ),
    "openai-compatible-batch:together": Card(
        name="openai-compatible-batch:together", kind="batch", provider="Together AI", protocol="openai", billing="together", tier="batch",
        endpoints=(CHAT,),
        limits=Limits(max_requests=50_000, max_bytes=100 * MB, min_requests=1, custom_id_max=64, one_model_per_batch=True, one_endpoint_per_batch=True,
                      enqueued_tokens="up to 30B tokens enqueued per model (Together's limit; not planned by lowtide)"),
        lines=_OPENAI_LINES, recovery=_OPENAI_RECOVERY,
        # Together's words are upper case, and it spells one with one L (together-python types/batch.py)
        status=_OPENAI_BATCH_STATUS | {s.upper(): m for s, m in _OPENAI_BATCH_STATUS.items()} | {"CANCELING": "cancelling"},
        retention=Retention(window_s=24 * HOUR, note="the 24h completion window is Together's default and cannot be changed; best effort"),
        discount=Discount(factor=None, stacks_with_cache=None, source="docs.together.ai batch overview: up to 50% off serverless rates, on selected models"),
        turnaround=Prior(p50=HOUR, p95=24 * HOUR, per_request=False,
                         source="Together: the 24-hour window is a maximum; batches under 1,000 requests typically finish in minutes"),
        wire=Wire(base_url="https://api.together.xyz/v1", key_env="TOGETHER_API_KEY", purpose="batch-api"),
        unconfirmed=("discount.factor", "limits.one_model_per_batch", "limits.metadata", "recovery", "status", "retention.inputs_s",
                     "retention.results_s", "ends.expired", "ends.cancelled", "discount.stacks_with_cache", "privacy.residency",
                     "privacy.zero_retention"),
        sources=("docs.together.ai/docs/inference/batch/overview", "docs.together.ai/docs/inference/batch/tutorial",
                 "together-python resources/batch.py, types/batch.py (create answers {job}; a job has progress, error)"),
    ),
    "openai-compatible-batch:novita": Card(
        name="openai-compatible-batch:novita", kind="batch", provider="Novita AI", protocol="openai", billing="novita", tier="batch",
        endpoints=(CHAT, COMPLETIONS),
        limits=Limits(max_requests=50_000, max_bytes=100 * MB, min_requests=1, one_model_per_batch=True, one_endpoint_per_batch=True),
        lines=_OPENAI_LINES, recovery=_OPENAI_RECOVERY, status=_OPENAI_BATCH_STATUS,
        retention=Retention(note="Novita's guide gives results within 24 h in one version and 48 h in another"),
        wire=Wire(base_url=None, key_env="NOVITA_API_KEY"),
        unconfirmed=("wire.base_url", "limits.max_requests", "limits.max_bytes", "limits.custom_id_max", "limits.metadata", "recovery",
                     "retention.window_s", "retention.inputs_s", "retention.results_s", "ends.expired", "ends.cancelled", "discount",
                     "privacy.residency", "privacy.zero_retention", "turnaround"),
        sources=("novita.ai/docs/guides/llm-batch-api",),
    ),
    "openai-compatible-batch:doubleword": Card(
        name="openai-compatible-batch:doubleword", kind="batch", provider="Doubleword", protocol="openai", billing="doubleword",
        tier="batch", endpoints=(CHAT, EMBEDDINGS),
        # no request count is stated: OpenAI's 50,000 as lowtide's bound (unconfirmed)
        limits=Limits(max_requests=50_000, max_bytes=200 * MB, min_requests=1, custom_id_max=64, one_model_per_batch=True,
                      one_endpoint_per_batch=True),
        lines=_OPENAI_LINES, recovery=_OPENAI_RECOVERY, status=_OPENAI_BATCH_STATUS,
        retention=Retention(window_s=24 * HOUR, note="completion_window 24h (the cheapest); Doubleword also takes 1h at a higher price, "
                                                     "which lowtide does not send yet"),
        discount=Discount(factor=None, stacks_with_cache=None,
                          source="Doubleword: batch prices are per model and per completion window, not one share of real time"),
        turnaround=Prior(p50=4 * HOUR, p95=24 * HOUR, per_request=False, source="Doubleword: a 24-hour SLA, no typical time published"),
        wire=Wire(base_url="https://api.doubleword.ai/v1", key_env="DOUBLEWORD_API_KEY"),
        unconfirmed=("limits.max_requests", "limits.metadata", "recovery", "retention.inputs_s", "retention.results_s", "ends.expired",
                     "ends.cancelled", "discount.factor", "discount.stacks_with_cache", "privacy.residency", "privacy.zero_retention",
                     "turnaround"),
        sources=("github.com/doublewordai/batch-skill (Doubleword's batch guide: OpenAI's Batch API at api.doubleword.ai/v1, "
                 "purpose batch, custom_id ≤ 64, files ≤ 200 MB, completion_window 24h or 1h)", "docs.doubleword.ai/inference-api"),
    ),
    # Not a profile, on purpose (docs/batch-routes.md): Fireworks' batch is its own dataset +
    # batchInferenceJobs API, which the openai SDK does not speak, so it is not faked here.
    # `digitalocean-batch`: DigitalOcean's batch inference (routes/digitalocean/batch.py, the pydo
    # SDK): uploads through a presigned URL (POST /v1/batches/files, then PUT), creates with
    # `file_id`, `provider` and a required `request_id`, answers `batch_id`, hands results out
    # as download links. Not a profile either: the openai SDK speaks none of that.
    "digitalocean-batch": Card(
        name="digitalocean-batch", kind="batch", provider="DigitalOcean (Gradient AI serverless batch inference)",
        protocol="openai", billing=None, tier="batch", endpoints=(CHAT, RESPONSES),
        limits=Limits(max_requests=50_000, max_bytes=200 * MB, min_requests=1, one_model_per_batch=True, one_endpoint_per_batch=True,
                      metadata="none sent: the dispatch's key travels as the create's request_id"),
        lines=Lines(input='{"custom_id", "method": "POST", "url", "body"} per JSONL line (provider openai; the url is the '
                          "batch's endpoint)", result_key="custom_id"),
        recovery=Recovery(how="idempotency_key", field="request_id",
                          note="the dispatch's key is the create's request_id (a create repeating it answers the batch "
                               "it made); find lists batches newest first (route_options.find_hours, 48) and adopts the one "
                               "with it"),
        retention=Retention(window_s=24 * HOUR, results_s=30 * DAY,
                            note="completion_window 24h; result files are kept up to 30 days after the job completes, "
                                 "their download links are short-lived and fetched just before reading"),
        ends=Ends(expired=None, cancelled=None),
        status=_OPENAI_BATCH_STATUS,
        discount=Discount(factor=None, stacks_with_cache=None,
                          source="DigitalOcean bills batch per model; genai-prices has no DigitalOcean price list, so "
                                 "lowtide estimates no cost (billing None)"),
        turnaround=Prior(p50=4 * HOUR, p95=24 * HOUR, per_request=False,
                         source="DigitalOcean: typically within 24 hours, no typical time published"),
        unconfirmed=("limits.custom_id_max", "limits.one_model_per_batch", "retention.inputs_s", "ends.expired", "ends.cancelled",
                     "discount.factor", "discount.stacks_with_cache", "privacy.residency", "privacy.zero_retention", "turnaround"),
        sources=("docs.digitalocean.com/products/inference/how-to/use-batch-inference (≤ 200 MB, ≤ 50,000 lines, OpenAI and "
                 "Anthropic text models only)", "docs.digitalocean.com/reference/api/reference/batch-inference",
                 "pydo 0.44 operations (create_batch_file, create_batch, get_batch, list_batches, get_batch_results, cancel_batch)"),
    ),
    # `azure-batch`: the same API at an Azure OpenAI resource (routes/azure/batch.py): the
    # resource's own base URL, the key in an `api-key` header, `model` the deployment's name.
    "azure-batch": Card(
        name="azure-batch", kind="batch", provider="Azure OpenAI (Global Batch)", protocol="openai", billing="azure", tier="batch",
        endpoints=(CHAT, RESPONSES, EMBEDDINGS),
        limits=Limits(
            max_requests=100_000, max_bytes=200 * MB, min_requests=1, one_model_per_batch=True, one_endpoint_per_batch=True,
            enqueued_tokens="per deployment: the quota set in Azure, not published per model; route_options.max_enqueued_tokens",
            metadata="16 pairs, keys ≤ 64 characters, values ≤ 512 (Azure's v1 reference)",
        ),
        lines=Lines(input='{"custom_id", "method": "POST", "url", "body"} per JSONL line; body.model is the deployment name',
                    result_key="custom_id"),
        recovery=_OPENAI_RECOVERY, status=_OPENAI_BATCH_STATUS,
        retention=Retention(note="Azure aims to finish in 24 h and does not expire a job that takes longer: "
                                 "it runs until it ends or is cancelled (a job's deadline cancels it)"),
        ends=Ends(expired="Azure does not expire jobs",
                  cancelled="the work already finished is returned (and billed); the rest is cancelled"),
        discount=Discount(factor=Decimal("0.5"), stacks_with_cache=None, source="Azure OpenAI Global Batch: 50% less than Global Standard"),
        privacy=Privacy(residency="at rest in the resource's Azure geography; processed in any Azure OpenAI location (Global Batch)",
                        note="Entra ID tokens are not supported yet: a key in the api-key header"),
        turnaround=Prior(p50=4 * HOUR, p95=24 * HOUR, per_request=False, source="Azure: a 24-hour target turnaround, not a limit; no typical time published"),
        wire=Wire(base_url=None, key_env="AZURE_OPENAI_API_KEY", auth="api-key"),
        unconfirmed=("endpoints", "limits.max_requests", "limits.custom_id_max", "retention.inputs_s", "retention.results_s",
                     "discount.stacks_with_cache", "privacy.zero_retention"),
        sources=("learn.microsoft.com/azure/foundry/openai/how-to/batch", "learn.microsoft.com/azure/foundry/openai/latest (v1: POST /openai/v1/batches)",
                 "learn.microsoft.com/azure/foundry/openai/api-version-lifecycle"),
    ),
    # `openrouter-batch`: OpenRouter's Batch API (routes/openrouter/batch.py): inline JSON, no files,
    # one model and one endpoint per batch, run on one upstream provider OpenRouter picks.
    "openrouter-batch": Card(
        name="openrouter-batch", kind="batch", provider="OpenRouter (one upstream provider per batch)", protocol="openai",
        billing="openrouter", tier="batch", endpoints=(CHAT, RESPONSES, MESSAGES, EMBEDDINGS),
        limits=Limits(max_requests=5_000, max_bytes=200 * MB, min_requests=1, one_model_per_batch=True, one_endpoint_per_batch=True,
                      metadata="none: a batch carries nothing of the caller's (no metadata, no idempotency key)"),
        lines=Lines(input='{"custom_id", "body"} per entry of the create call\'s `requests`, after `endpoint` and `model`; '
                          "images and files by http(s) URL only", result_key="custom_id"),
        recovery=Recovery(how="match", note="no metadata, no idempotency key: a batch of the dispatch's size created in its "
                          "window (route_options.find_window, 600 s) is adopted once ended and holding only its custom_ids"),
        retention=Retention(window_s=24 * HOUR, results_s=30 * DAY,
                            note="results are read from GET /batches/{id} once it has ended; the API reference "
                                 "speaks of a 30-day artifact retention window; a batch may be deleted once ended"),
        ends=Ends(expired=None, cancelled=None),
        status=_OPENAI_BATCH_STATUS,
        discount=Discount(factor=Decimal("0.5"), stacks_with_cache=None,
                          source="openrouter.ai/docs/guides/features/batch-api: typically 50% of the model's standard per-token "
                                 "price; some components are not discounted"),
        privacy=Privacy(zero_retention=False, note="OpenRouter's guide: use the sync API for Zero Data Retention; "
                        "the cheapest eligible batch provider is picked unless route_options.provider_only pins one"),
        turnaround=Prior(p50=4 * HOUR, p95=24 * HOUR, per_request=False, source="OpenRouter: a 24-hour completion window, no typical time published"),
        unconfirmed=("discount.factor", "discount.stacks_with_cache", "retention.inputs_s", "retention.results_s", "ends.expired",
                     "ends.cancelled", "limits.custom_id_max", "privacy.residency"),
        sources=("openrouter.ai/docs/guides/features/batch-api", "openrouter.ai/docs/batch-quickstart",
                 "openrouter python SDK 1.3.84 batch.py (POST/GET /batches, GET /batches/{id}, DELETE)"),
    ),
    # `mistral-batch`: Mistral's own batch job API (routes/mistral/batch.py, the mistralai SDK):
    # a JSONL file of {custom_id, body} lines, one model and one endpoint per job, `timeout_hours`.
    "mistral-batch": Card(
        name="mistral-batch", kind="batch", provider="Mistral AI", protocol="openai", billing="mistral", tier="batch",
        endpoints=(CHAT, EMBEDDINGS),
        limits=Limits(max_requests=1_000_000, max_bytes=512 * MB, min_requests=1, one_model_per_batch=True,
                      one_endpoint_per_batch=True, metadata="a mapping of text to text (the SDK's `metadata: Dict[str, str]`)"),
        lines=Lines(input='{"custom_id", "body"} per JSONL line; the job names the model and the endpoint', result_key="custom_id"),
        recovery=Recovery(how="metadata", field="metadata.lowtide_key",
                          note="find lists jobs newest first (pages of 100, back route_options.find_hours, 48) and adopts "
                               "the one with the key; the list's metadata filter is not relied on"),
        retention=Retention(window_s=24 * HOUR, results_s=24 * HOUR,
                            note="a job still running after timeout_hours (24 by default; route_options.timeout_hours) ends "
                                 "TIMEOUT_EXCEEDED; results can be downloaded only for a limited time after the job ends "
                                 "(24 h per issue 30): the route reads them as soon as a poll sees it ended"),
        ends=Ends(expired="TIMEOUT_EXCEEDED: the requests answered are in the output file; the rest, with no line, are "
                          "retried or sent to the fallback route as expired",
                  cancelled="CANCELLED: the requests answered are in the output file; the rest are retried or fall back"),
        status={"QUEUED": "running", "RUNNING": "running", "CANCELLATION_REQUESTED": "cancelling", "SUCCESS": "ended",
                "FAILED": "failed", "TIMEOUT_EXCEEDED": "expired", "CANCELLED": "cancelled"},
        discount=Discount(factor=Decimal("0.5"), stacks_with_cache=None, source="Mistral batch inference: 50% of the real-time price"),
        unconfirmed=("limits.max_requests", "limits.custom_id_max", "retention.results_s", "retention.inputs_s", "ends.expired",
                     "ends.cancelled", "discount.factor", "discount.stacks_with_cache", "privacy.residency", "privacy.zero_retention",
                     "turnaround"),
        sources=("docs.mistral.ai/capabilities/batch", "docs.mistral.ai/api/endpoint/batch",
                 "mistralai 3.7 client/jobs.py, files.py (upload: 512 MB a file), models/batchjobstatus.py, createbatchjobrequest.py"),
    ),
    # `vertex-batch`: Gemini models on Vertex AI batch prediction (routes/vertex/batch.py, google-genai
    # with vertexai=True): a JSONL file in Cloud Storage in, a folder of predictions out.
    "vertex-batch": Card(
        name="vertex-batch", kind="batch", provider="Google Cloud (Vertex AI batch prediction)", protocol="gemini",
        billing="google", tier="batch", endpoints=(GEMINI,),
        limits=Limits(max_requests=200_000, max_bytes=1024 * MB, min_requests=1, one_model_per_batch=True,
                      metadata="a display name (the dispatch's key); labels on each request (its custom_id)"),
        lines=Lines(input='{"request": GenerateContentRequest} per JSONL line in Cloud Storage, the custom_id in '
                          "request.labels (lowtide_id, base32)", result_key="request.labels.lowtide_id"),
        recovery=Recovery(how="display_name", field="displayName",
                          note='find lists jobs filtered by display_name="KEY" (route_options.find_pages, 10 pages of 100)'),
        retention=Retention(note="inputs and outputs are objects in your bucket (route_options.staging): they stay until "
                                 "you delete them; lowtide deletes none"),
        ends=Ends(expired="the requests answered keep their predictions lines; the rest, with none, are retried or sent "
                          "to the fallback route",
                  cancelled="the lines already written are kept; the requests without one are retried or fall back"),
        status={"JOB_STATE_QUEUED": "running", "JOB_STATE_PENDING": "running", "JOB_STATE_RUNNING": "running",
                "JOB_STATE_PAUSED": "running", "JOB_STATE_UPDATING": "running", "JOB_STATE_CANCELLING": "cancelling",
                "JOB_STATE_SUCCEEDED": "ended", "JOB_STATE_PARTIALLY_SUCCEEDED": "ended", "JOB_STATE_FAILED": "failed",
                "JOB_STATE_EXPIRED": "expired", "JOB_STATE_CANCELLED": "cancelled"},
        discount=Discount(factor=Decimal("0.5"), stacks_with_cache=False,
                          source="Vertex AI batch inference: 50% less than real time; the implicit-cache discount takes "
                                 "precedence and does not stack with it"),
        privacy=Privacy(residency="the job's location (route_options.location; the global endpoint keeps no residency)"),
        turnaround=Prior(p50=4 * HOUR, p95=24 * HOUR, per_request=False,
                         source="Vertex AI: jobs typically complete within 24 hours of starting; no typical time published"),
        unconfirmed=("limits.max_requests", "limits.max_bytes", "limits.custom_id_max", "retention.window_s", "ends.expired",
                     "ends.cancelled", "privacy.zero_retention"),
        sources=("cloud.google.com/vertex-ai/generative-ai/docs/multimodal/batch-prediction-gemini",
                 "cloud.google.com/vertex-ai/generative-ai/docs/multimodal/batch-prediction-from-cloud-storage",
                 "googleapis/python-genai batches.py (batchPredictionJobs create/get/list/cancel, JobState)",
                 "BerriAI/litellm llms/vertex_ai (a Vertex line matched by a request label)"),
    ),
    "echo-batch": Card(
        name="echo-batch", kind="batch", provider="lowtide (echo, a folder)", protocol=None, billing=None, tier="free",
        endpoints=(CHAT, RESPONSES, COMPLETIONS, MESSAGES, GEMINI, EMBEDDINGS, MODERATIONS),
        limits=Limits(max_bytes=100 * MB, min_requests=1),
        lines=Lines(input="the request as stored, one JSON file per batch", result_key="custom_id",
                    order="reversed, on purpose: results are matched by custom_id"),
        recovery=Recovery(how="local", field="meta.json key", note="batches are folders that outlive the process"),
        retention=Retention(note="kept in its folder until deleted"),
        ends=Ends(expired="never expires", cancelled="requests not done come back as batch_cancelled"),
        status={"in_progress": "running", "cancelling": "cancelling", "ended": "ended"},
        privacy=Privacy(residency="this machine", zero_retention=True),
        turnaround=Prior(p50=1.0, p95=5.0, per_request=False, source="lowtide's echo batch route"),
        sources=("src/lowtide/routes/own/echo_batch.py",),
    ),
    "openai": Card(
        name="openai", kind="direct", provider="OpenAI", protocol="openai", billing="openai", tier="realtime",
        endpoints=(CHAT, RESPONSES, COMPLETIONS, EMBEDDINGS, MODERATIONS), retention=_DIRECT_RETENTION,
        discount=Discount(factor=Decimal("0.5"), stacks_with_cache=None,
                          source="route_options.service_tier: flex bills at batch-rate prices"),
        turnaround=Prior(p50=0.5, p95=2.0, per_request=True, source=_REALTIME),
        tier_turnaround={"flex": Prior(p50=2.0, p95=10.0, per_request=True,
                                       source="flex: slower answers and 429s when capacity is short (OpenAI flex guide)")},
        unconfirmed=("discount.stacks_with_cache", "privacy.residency", "privacy.zero_retention"),
        sources=("platform.openai.com/docs/guides/flex-processing",),
    ),
    "openai-compatible": Card(
        name="openai-compatible", kind="direct", provider="any OpenAI-compatible server (vLLM, SGLang, llama.cpp)",
        protocol="openai", billing=None, tier="self_hosted", endpoints=(CHAT, RESPONSES, COMPLETIONS, EMBEDDINGS),
        retention=Retention(note="whatever the server keeps"),
        privacy=Privacy(residency="wherever route_options.base_url points"),
    ),
    "anthropic": Card(
        name="anthropic", kind="direct", provider="Anthropic", protocol="anthropic", billing="anthropic", tier="realtime",
        endpoints=(MESSAGES,), limits=Limits(custom_id_max=64, custom_id_pattern=_ANTHROPIC_PATTERN), retention=_DIRECT_RETENTION,
        turnaround=Prior(p50=0.5, p95=2.0, per_request=True, source=_REALTIME),
        unconfirmed=("privacy.residency", "privacy.zero_retention"),
    ),
    "gemini": Card(
        name="gemini", kind="direct", provider="Google", protocol="gemini", billing="google", tier="realtime",
        endpoints=(GEMINI,), retention=_DIRECT_RETENTION,
        discount=Discount(factor=Decimal("0.5"), stacks_with_cache=None,
                          source="route_options.service_tier: flex, about half the standard price; UNCONFIRMED per model"),
        unconfirmed=("discount.factor", "privacy.residency", "privacy.zero_retention", "turnaround"),
    ),
    "echo": Card(
        name="echo", kind="direct", provider="lowtide (echo)", protocol=None, billing=None, tier="free",
        endpoints=(CHAT, RESPONSES, COMPLETIONS, MESSAGES, GEMINI, EMBEDDINGS, MODERATIONS),
        retention=Retention(note="nothing is kept"), privacy=Privacy(residency="this machine", zero_retention=True),
        turnaround=Prior(p50=0.001, p95=0.01, per_request=True, source="lowtide's echo route"),
    ),
    "local": Card(
        name="local", kind="direct", provider="lowtide (embedded model)", protocol=None, billing=None, tier="self_hosted",
        endpoints=(CHAT, RESPONSES, COMPLETIONS, MESSAGES, EMBEDDINGS),
        retention=Retention(note="nothing is kept"), privacy=Privacy(residency="this machine", zero_retention=True),
        unconfirmed=("turnaround",),
    ),
}

# `bedrock-batch`: AWS Bedrock's batch inference (routes/bedrock/batch.py, boto3 and s3fs): a JSONL
# file of {recordId, modelInput} records in S3, one model a job, results written back to S3.
CARDS["bedrock-batch"] = Card(
    name="bedrock-batch", kind="batch", provider="AWS Bedrock (batch inference)", protocol="anthropic",
    # Priced by genai-prices' AWS list, which knows Bedrock's own ids (us.anthropic.claude-…-v1:0).
    billing="aws", tier="batch", endpoints=(MESSAGES,),
    limits=Limits(max_requests=50_000, max_bytes=1024 * MB, min_requests=100, one_model_per_batch=True, one_endpoint_per_batch=True,
                  metadata="a job name and a clientRequestToken (both the dispatch's key); tags, which lowtide does not set"),
    lines=Lines(input='{"recordId", "modelInput"} per JSONL line in S3; modelInput is the model\'s InvokeModel body (Claude: a '
                      'Messages body with anthropic_version bedrock-2023-05-31 and no model); the job names the model',
                result_key="recordId"),
    recovery=Recovery(how="idempotency_key", field="clientRequestToken",
                      note="the key is the job's name and its idempotency token: a create sent again answers the same job; "
                           "find lists jobs whose name holds the key (nameContains) and adopts the one with the token"),
    retention=Retention(window_s=24 * HOUR,
                        note="the job's timeoutDurationInHours (route_options.timeout_hours, 24 to 168; 24 here) ends it Expired; "
                             "input and output stay in the user's own S3 bucket until they delete them"),
    ends=Ends(expired="Expired: the records answered are in the .out file; the rest have no record and are retried or fall back",
              cancelled="Stopped: only tokens already processed are billed; the records answered are in the .out file, the rest "
                        "are retried or fall back"),
    status={"Submitted": "running", "Validating": "running", "Scheduled": "running", "InProgress": "running",
            "Stopping": "cancelling", "Completed": "ended", "PartiallyCompleted": "ended", "Failed": "failed",
            "Stopped": "cancelled", "Expired": "expired"},
    discount=Discount(factor=Decimal("0.5"), stacks_with_cache=None,
                      source="aws.amazon.com/bedrock/pricing: batch inference at 50% of on-demand, for the models that offer it"),
    privacy=Privacy(residency="the AWS region of the job (route_options.region); an inference profile (us., eu., global.) may "
                              "route to other regions of its geography",
                    note="credentials from AWS's own chain (environment, profile, role); never in the spec or the store"),
    turnaround=Prior(p50=4 * HOUR, p95=24 * HOUR, per_request=False, source="AWS: jobs run within the job's timeout; no typical time published"),
    unconfirmed=("limits.max_requests", "limits.max_bytes", "limits.custom_id_max", "limits.min_requests",
                 "retention.window_s", "ends.expired", "discount.stacks_with_cache", "privacy.zero_retention", "turnaround"),
    sources=("docs.aws.amazon.com/bedrock/latest/userguide/batch-inference-data.html (records, the quotas by name)",
             "docs.aws.amazon.com/bedrock/latest/userguide/batch-inference-results.html (.out records, manifest.json.out)",
             "botocore data/bedrock/2023-04-20/service-2.json (CreateModelInvocationJob, statuses, patterns)",
             "docs.aws.amazon.com/general/latest/gr/bedrock.html (quotas: 100 records a job at least, per model)"),
)
