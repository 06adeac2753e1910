"""The gateway's configuration: one Pydantic model (unknown keys refused), loaded from YAML
with every problem naming the file, the line and the key, as job specs are.

    upstreams:                      # where urgent requests are forwarded, as they are
      openai:    {base_url: https://api.openai.com/v1, api_key_env: OPENAI_API_KEY,
                  limits: {max_in_flight: 200, rpm: 5000, tpm: 2000000, threshold: 0.8}}
      anthropic: {base_url: https://api.anthropic.com, api_key_env: ANTHROPIC_API_KEY}
    batch:                          # where deferred requests run, as lowtide jobs
      openai:    {route: openai-batch, models: {gpt-4o-mini: gpt-4o-mini}}
    collector: {flush_size: 1000, flush_age: 60s}
    rules:
      - {match: {tenant: analytics}, action: defer, max_wait: 6h}
      - {match: {model: "gpt-4o*", tag: nightly}, action: prefer_realtime, max_wait: 2h}
    classifier: mypkg.policy:classify
    tenants:
      - {name: acme, key_sha256: 9f86d0…, quotas: {max_pending: 100000, rpm: 6000}}
    callbacks: {allowlist: ["*.acme.com"], allow_private: false, allow_loopback: false}
    webhooks: {secret_env: LOWTIDE_WEBHOOK_SECRET, max_attempts: 8}

Keys never appear in the file: upstream keys and the webhook secret are read from the
environment variables it names; tenant keys are given as their SHA-256 (hex).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from lowtide.core.callbacks import Callbacks
from lowtide.core.yamlfile import parse_mapping, read_text, validate
from lowtide.routes.provider import not_a_variable

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


_DURATION_DIGITS = 18  # more than any real duration needs; float() of 400 digits is inf


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def parse_duration(value: Any) -> float:
    """Seconds from `90`, `"90s"`, `"10m"`, `"2h"`, `"1d"`; ValueError otherwise (an
    infinite, NaN or absurdly long one included)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 90s, 10m, 2h or 1d; got {_shown(value)}")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    else:
        m = _DURATION.match(str(value))
        if m is None:
            raise ValueError(f"expected a duration such as 90s, 10m, 2h or 1d; got {_shown(value)}")
        if len(m.group(1).partition(".")[0]) > _DURATION_DIGITS:
            raise ValueError(f"a duration has at most {_DURATION_DIGITS} digits; got {_shown(value)}")
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite; got {_shown(value)}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative; got {_shown(value)}")
    return seconds


def describe_duration(seconds: float) -> str:
    """`86400` → `24h`, `5400` → `90m`, `45` → `45s` (for messages)."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _variable(name: str) -> str:
    """An environment variable's name; never repeated in the error: it may be the key itself."""
    if not_a_variable(name):
        raise ValueError("must name an environment variable (capitals, digits, _), not hold the secret itself; the value is not repeated here")
    return name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoadLimits(_Strict):
    """An upstream's real-time capacity. Load is the highest of in_flight / max_in_flight,
    requests in the last minute / rpm, tokens in the last minute / tpm, and 1.0 for
    `cooldown_after_429` after the upstream answered 429. Above `threshold`, requests that
    may wait but prefer real time are deferred (shaved)."""

    max_in_flight: int | None = Field(None, ge=1)
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    threshold: float = Field(0.8, gt=0, le=10)
    cooldown_after_429: Duration = 30.0


# Headers an operator may not forward: keys, hop-by-hop and framing headers.
_NEVER_FORWARDED = frozenset({"authorization", "x-api-key", "proxy-authorization", "cookie", "host", "content-length",
                              "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade", "proxy-authenticate"})  # fmt: skip


class Upstream(_Strict):
    # OpenAI: the API root as the SDK's base_url has it (…/v1); Anthropic: the host (no /v1).
    base_url: str
    api_key_env: str | None = None  # None: the upstream takes no key (a self-hosted server)
    timeout: Duration = 600.0
    max_connections: int = Field(512, ge=1)  # requests forwarded at once; more wait their turn
    limits: LoadLimits = Field(default_factory=LoadLimits)
    # The route whose real-time prices "money saved" is measured against (default: the API's).
    price_as: str | None = None
    # Client headers forwarded besides proxy.FORWARDED (e.g. anthropic-beta): each acts with
    # the upstream's key for every tenant; see docs/gateway.md, "Headers".
    forward_headers: list[str] = Field(default_factory=list)

    @field_validator("forward_headers")
    @classmethod
    def _forward_headers(cls, v: list[str]) -> list[str]:
        names = [name.strip().lower() for name in v]
        for name in names:
            if not re.fullmatch(r"[a-z0-9!#$%&'*+.^_`|~-]+", name):
                raise ValueError(f"{_shown(name)} is not a header name")
            if name in _NEVER_FORWARDED or name.startswith("x-lowtide-"):
                raise ValueError(f"{name} is never forwarded: it carries a key, a connection's state or lowtide's own data")
        return names

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("give an http:// or https:// URL")
        return v.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _key_env(cls, v: str | None) -> str | None:
        return v if v is None else _variable(v)


class Upstreams(_Strict):
    openai: Upstream | None = None
    anthropic: Upstream | None = None


class Fallback(_Strict):
    route: str
    route_options: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None


class BatchTarget(_Strict):
    """Where one API's deferred requests run: a lowtide route (a batch route such as
    `openai-batch`, or any route), with a model mapping and the deadline policy."""

    route: str
    route_options: dict[str, Any] = Field(default_factory=dict)
    # Client model → model on `route`. None: every model, under its own name; a mapping:
    # only these models are deferred, the others always go real time.
    models: dict[str, str] | None = None
    # Seconds a batch of `route` takes, until the store has seen enough of them to know.
    expected_turnaround: Duration = 3600.0
    # Seconds before a request's deadline by which it must be on its way on the fallback.
    safety_margin: Duration = 120.0
    # Where requests go that the batch route cannot finish before their deadline. Default:
    # the upstream itself, through lowtide's real-time route for that API; `none` for none.
    fallback: Fallback | Literal["none"] | None = None
    max_attempts: int = Field(3, ge=1, le=100)

    @model_validator(mode="before")
    @classmethod
    def _no_invented_limit(cls, data: Any) -> Any:
        if isinstance(data, dict) and "default_max_tokens" in data:
            raise ValueError("default_max_tokens is gone: a deferred body is sent as it came, with no limit "
                             "added; remove the key (a client that wants a limit sets max_tokens in its call)")  # fmt: skip
        return data


class BatchTargets(_Strict):
    openai: BatchTarget | None = None
    anthropic: BatchTarget | None = None


class Collector(_Strict):
    flush_size: int = Field(1000, ge=1)  # a flush as soon as this many wait for one (api, model)
    flush_age: Duration = 60.0  # ... or when the oldest has waited this long
    max_job_requests: int = Field(50_000, ge=1)


class RuleMatch(_Strict):
    """Every condition given must hold. `model` is a glob; `tag` is one of the request's
    `X-Lowtide-Tag` values; `metadata` pairs must all be in the body's `metadata`."""

    tenant: str | None = None
    model: str | None = None
    path: str | None = None
    tag: str | None = None
    metadata: dict[str, str] | None = None


class Rule(_Strict):
    match: RuleMatch = Field(default_factory=RuleMatch)
    action: Literal["realtime", "defer", "prefer_realtime"]
    max_wait: Duration | None = None  # default: `default_max_wait`


class Quotas(_Strict):
    max_pending: int | None = Field(None, ge=0)  # deferred requests not yet finished
    rpm: int | None = Field(None, ge=1)  # requests per minute, real time and deferred


class Tenant(_Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$")
    key_sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    quotas: Quotas = Field(default_factory=Quotas)


class Webhooks(_Strict):
    secret_env: str = "LOWTIDE_WEBHOOK_SECRET"
    max_attempts: int = Field(8, ge=1, le=100)  # then the delivery is dead (dead letter)
    backoff: Duration = 2.0  # seconds before the 2nd attempt; doubled each time, ±20 %
    max_backoff: Duration = 600.0
    timeout: Duration = Field(10.0, gt=0)  # one deadline per attempt: URL check, connect, send, the answer's status
    concurrency: int = Field(32, ge=1)  # attempts in flight at once
    per_tenant: int = Field(8, ge=1)  # of them, at most this many for one tenant's results

    @field_validator("secret_env")
    @classmethod
    def _secret_env(cls, v: str) -> str:
        return _variable(v)


class GatewayConfig(_Strict):
    db: str | None = None  # default: `lowtide --db`, LOWTIDE_DB, ./lowtide.db
    data_dir: str = "lowtide-gateway"  # the flushes' source files
    # How clients reach the gateway (status URLs, webhook `status_url`); None: relative URLs.
    public_url: str | None = None
    upstreams: Upstreams = Field(default_factory=Upstreams)
    batch: BatchTargets = Field(default_factory=BatchTargets)
    collector: Collector = Field(default_factory=Collector)
    rules: list[Rule] = Field(default_factory=list)
    classifier: str | None = Field(None, pattern=r"^[\w.]+:[\w.]+$")  # "module:function"
    default_max_wait: Duration = 86400.0
    # The longest wait a client may ask for (X-Lowtide-Defer) and a rule may give: the
    # providers' batch window. A longer header is refused (400); see docs/gateway.md.
    max_defer: Duration = Field(86400.0, gt=0)
    tenants: list[Tenant] = Field(default_factory=list)  # none: any key, one tenant "default"
    callbacks: Callbacks = Field(default_factory=Callbacks)
    webhooks: Webhooks = Field(default_factory=Webhooks)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    # Batch files and message batches (upload endpoints): streamed to the upstream as they
    # arrive, so this bounds what passes, not what is held.
    max_upload_bytes: int = Field(512 * 1024 * 1024, ge=1024)
    body_timeout: Duration = Field(30.0, gt=0)  # how long a client may pause mid-body (then 408)
    max_json_depth: int = Field(64, ge=2, le=512)  # nesting of a body (server/safejson.py)
    base_dir: str = "."  # relative paths are resolved against it (the config file's folder)

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("give the http:// or https:// URL clients reach the gateway at")
        return v.rstrip("/") if v is not None else None

    @model_validator(mode="after")
    def _waits_within_max_defer(self) -> GatewayConfig:
        if self.default_max_wait > self.max_defer:
            raise ValueError(f"default_max_wait ({describe_duration(self.default_max_wait)}) is over max_defer "
                             f"({describe_duration(self.max_defer)}); lower it or raise max_defer")  # fmt: skip
        for i, rule in enumerate(self.rules):
            if rule.max_wait is not None and rule.max_wait > self.max_defer:
                raise ValueError(f"rules.{i}.max_wait ({describe_duration(rule.max_wait)}) is over max_defer "
                                 f"({describe_duration(self.max_defer)}); lower it or raise max_defer")  # fmt: skip
        return self

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else Path(self.base_dir) / p


def load_gateway_config(path: str | Path) -> GatewayConfig:
    """Read a gateway config file; every problem names the file, line and key."""
    path = Path(path)
    text = read_text(path, "gateway config")
    data, lines = parse_mapping(
        text, str(path), "a gateway config is a YAML mapping with keys such as upstreams, batch, tenants", empty_ok=True
    )
    data.setdefault("base_dir", str(path.parent.resolve()))
    return build_gateway_config(data, where=str(path), lines=lines)


def build_gateway_config(data: dict[str, Any], where: str = "gateway config", lines: dict | None = None) -> GatewayConfig:
    return validate(GatewayConfig, data, where, "gateway config", lines)

