"""What the gateway's parts share while it runs; handlers reach it as
`request.app.state.gateway`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lowtide.core.clock import Clock
from lowtide.server.gateway.config import BatchTarget, Fallback, GatewayConfig, Upstream
from lowtide.server.gateway.load import LoadTracker
from lowtide.server.gateway.metrics import Metrics
from lowtide.server.gateway.policy import Policy
from lowtide.server.gateway.tenants import Tenants
from lowtide.store.db import Store

if TYPE_CHECKING:
    from lowtide.server.gateway.admission import Admission
    from lowtide.server.gateway.collector import Collector
    from lowtide.server.gateway.documents import Documents
    from lowtide.server.gateway.owned import Owners
    from lowtide.server.gateway.proxy import UpstreamClient
    from lowtide.server.gateway.writer import GroupWriter

APIS = ("openai", "anthropic")
# Seconds a request cut over to the real-time fallback is expected to take, for the 202's
# expected completion time.
REALTIME_ESTIMATE = 60.0


@dataclass(slots=True)
class Gateway:
    config: GatewayConfig
    store: Store
    clock: Clock
    data_dir: Path
    tenants: Tenants
    policy: Policy
    metrics: Metrics
    secret: bytes | None  # the webhook signing secret; None: callbacks are refused
    routes: dict[str, Any] = field(default_factory=dict)  # ready-made routes for the engine
    route_kinds: dict[str, str] = field(default_factory=dict)  # api → kind of its batch target's route
    admissions: dict[str, Admission] = field(default_factory=dict)  # api → what its flush's lanes refuse
    loads: dict[str, LoadTracker] = field(default_factory=dict)
    upstreams: dict[str, UpstreamClient] = field(default_factory=dict)
    owners: Owners | None = None  # who owns which upstream object (scoped.py)
    documents: Documents | None = None  # their last documents, for listings (scoped.py)
    writer: GroupWriter | None = None
    collector: Collector | None = None

    def target(self, api: str) -> BatchTarget | None:
        return getattr(self.config.batch, api)

    def upstream_config(self, api: str) -> Upstream | None:
        return getattr(self.config.upstreams, api)

    def public_url(self) -> str | None:
        """How clients reach the gateway: from the config only, never from a request's
        `Host` (a caller could name its own host and receive others' status URLs)."""
        return self.config.public_url

    def fallback_for(self, api: str) -> tuple[str, dict[str, Any], str | None] | None:
        """(route, route_options, model) that a flush of `api` cuts over to near a deadline:
        the target's `fallback`, else the upstream itself through lowtide's real-time route."""
        target = self.target(api)
        if target is None or target.fallback == "none":
            return None
        if isinstance(target.fallback, Fallback):
            return target.fallback.route, dict(target.fallback.route_options), target.fallback.model
        up = self.upstream_config(api)
        if up is None:
            return None
        if api == "openai":
            if up.api_key_env:
                return "openai", {"base_url": up.base_url, "api_key_env": up.api_key_env}, None
            return "openai-compatible", {"base_url": up.base_url}, None
        if up.api_key_env:
            return "anthropic", {"base_url": up.base_url, "api_key_env": up.api_key_env}, None
        return None

    def expected_completion(self, api: str, now: float, deadline: float) -> tuple[float, bool]:
        """(when a request accepted now should be done, whether it must be flushed at once)."""
        target = self.target(api)
        assert target is not None
        turnaround = self.collector.turnaround.get(api, target.expected_turnaround) if self.collector else target.expected_turnaround
        latest = deadline - target.safety_margin - turnaround
        flush_at = max(now, min(now + self.config.collector.flush_age, latest))
        urgent = flush_at <= now
        if flush_at + turnaround <= deadline - target.safety_margin or self.fallback_for(api) is None:
            return flush_at + turnaround, urgent
        return min(deadline, flush_at + REALTIME_ESTIMATE), urgent
