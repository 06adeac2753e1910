"""Prometheus metrics at `GET /metrics` (text exposition format 0.0.4, written here: a
handful of counters does not need a client library).

    lowtide_gateway_requests_total{api, decision}    realtime | deferred | shaved
    lowtide_gateway_refused_total{api, reason}       auth | quota | size | callback | invalid | unbatchable
    lowtide_gateway_shaved_ratio                     shaved / all decided requests
    lowtide_gateway_deferred_finished_total{state}   succeeded | failed
    lowtide_gateway_saved_usd_total                  estimated: real-time price − actual cost
                                                     of finished deferred requests (store-wide)
    lowtide_gateway_webhook_deliveries_total{outcome} delivered | failed (will retry) | dead
    lowtide_gateway_dead_letters                     deliveries now dead (store-wide)
    lowtide_gateway_deferred_waiting                 accepted or queued (store-wide)
    lowtide_gateway_upstream_in_flight{api}, lowtide_gateway_upstream_load_ratio{api},
    lowtide_gateway_upstream_rate_limited_total{api} the load tracker's view

Counters since start-up are kept in memory; the store-wide figures are read at scrape time.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # the collector's thread counts too
        self.decisions: Counter[tuple[str, str]] = Counter()
        self.refused: Counter[tuple[str, str]] = Counter()
        self.finished_states: Counter[str] = Counter()
        self.webhooks: Counter[str] = Counter()

    def decided(self, api: str, decision: str) -> None:
        self.decisions[(api, decision)] += 1  # event loop only

    def refuse(self, api: str, reason: str) -> None:
        self.refused[(api, reason)] += 1

    def finished(self, state: str, saved_picousd: int | None) -> None:
        with self._lock:
            self.finished_states[state] += 1

    def webhook(self, outcome: str) -> None:
        with self._lock:
            self.webhooks[outcome] += 1

    def shaved_ratio(self) -> float:
        total = sum(self.decisions.values())
        shaved = sum(n for (_, d), n in self.decisions.items() if d == "shaved")
        return shaved / total if total else 0.0

    def render(self, summary: Mapping[str, Any], loads: Mapping[str, Any]) -> str:
        out: list[str] = []

        def family(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                out.append(f"{name}{labels} {value!r}")

        with self._lock:
            finished = dict(self.finished_states)
            webhooks = dict(self.webhooks)
        family("lowtide_gateway_requests_total", "counter", "Requests by the gateway's decision.",
               [(_labels(api=a, decision=d), n) for (a, d), n in sorted(self.decisions.items())])  # fmt: skip
        family("lowtide_gateway_refused_total", "counter", "Requests refused, by reason.",
               [(_labels(api=a, reason=r), n) for (a, r), n in sorted(self.refused.items())])  # fmt: skip
        family("lowtide_gateway_shaved_ratio", "gauge", "Share of decided requests deferred because of load.",
               [("", float(self.shaved_ratio()))])  # fmt: skip
        family("lowtide_gateway_deferred_finished_total", "counter", "Deferred requests finished, by state.",
               [(_labels(state=s), n) for s, n in sorted(finished.items())])  # fmt: skip
        family("lowtide_gateway_saved_usd_total", "counter",
               "Estimated USD saved: real-time price minus actual cost of finished deferred requests.",
               [("", float(summary.get("saved_picousd", 0)) / 1e12)])  # fmt: skip
        family("lowtide_gateway_webhook_deliveries_total", "counter", "Webhook attempts by outcome.",
               [(_labels(outcome=o), n) for o, n in sorted(webhooks.items())])  # fmt: skip
        family("lowtide_gateway_dead_letters", "gauge", "Webhook deliveries that gave up.",
               [("", summary.get("delivery", {}).get("dead", 0))])  # fmt: skip
        states = summary.get("state", {})
        family("lowtide_gateway_deferred_waiting", "gauge", "Deferred requests not finished yet.",
               [("", states.get("accepted", 0) + states.get("queued", 0))])  # fmt: skip
        family("lowtide_gateway_upstream_in_flight", "gauge", "Requests forwarded and not answered yet.",
               [(_labels(api=a), t.in_flight) for a, t in sorted(loads.items())])  # fmt: skip
        family("lowtide_gateway_upstream_load_ratio", "gauge", "Load against the upstream's limits (1.0 = at the limit).",
               [(_labels(api=a), float(t.ratio())) for a, t in sorted(loads.items())])  # fmt: skip
        family("lowtide_gateway_upstream_rate_limited_total", "counter", "429 answers from the upstream.",
               [(_labels(api=a), t.rate_limited) for a, t in sorted(loads.items())])  # fmt: skip
        return "\n".join(out) + "\n"


def _labels(**labels: str) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
