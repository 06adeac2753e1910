"""Policy: may this request wait, and for how long? Decided per request, first answer wins:

1. **headers** — `X-Lowtide-Priority: realtime` (must not be deferred; it wins over
   everything else), or `X-Lowtide-Defer: <max wait>` (`90s`, `10m`, `2h`, `1d`, seconds;
   finite and at most the config's `max_defer`, 24 h by default, else 400), with
   `X-Lowtide-Prefer: realtime` meaning "may wait, but prefers real time";
2. **rules** of the gateway config, in order: the first whose `match` holds (tenant, model
   glob, path, `X-Lowtide-Tag` value, body `metadata` pairs);
3. **the classifier hook** (`classifier: "module:function"`): called with a `RequestInfo`,
   returns a `Verdict`, a dict `{"mode": …, "max_wait": …}`, a mode string, or None (no
   opinion); a hook that raises counts as None (logged without the request);
4. otherwise real time.

A verdict's mode is `realtime`, `defer` (deferred now) or `prefer_realtime` (real time
unless the upstream's load is above its threshold: then *shaved*, i.e. deferred). Load and
the batch target's abilities are weighed afterwards, in `app.py`.
"""

from __future__ import annotations

import fnmatch
import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lowtide.server.gateway.config import GatewayConfig, Rule, describe_duration, parse_duration

log = logging.getLogger("lowtide.gateway")
Mode = Literal["realtime", "defer", "prefer_realtime"]
MODES = ("realtime", "defer", "prefer_realtime")


class PolicyError(ValueError):
    """A header the client got wrong (answered 400, naming the header)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    mode: Mode
    max_wait: float | None = None  # seconds; None: the config's default_max_wait
    source: str = "default"  # header | rule N | classifier | default


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What a rule or a hook sees. `headers` never holds the client's key."""

    tenant: str
    api: str  # openai | anthropic
    path: str
    model: str
    body: Mapping[str, Any]
    headers: Mapping[str, str]
    tags: tuple[str, ...] = field(default=())


REALTIME = Verdict("realtime")


def load_hook(spec: str | None) -> Callable[[RequestInfo], Any] | None:
    """`"module:function"` → the function (imported once, at start-up)."""
    if not spec:
        return None
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"classifier {spec!r}: cannot import it ({err}); give an importable module:function") from None
    if not callable(target):
        raise ValueError(f"classifier {spec!r} is not callable")
    return target


class Policy:
    def __init__(self, config: GatewayConfig, hook: Callable[[RequestInfo], Any] | None = None):
        self.rules = list(config.rules)
        self.default_max_wait = config.default_max_wait
        self.max_defer = config.max_defer
        self.hook = hook if hook is not None else load_hook(config.classifier)

    def decide(self, info: RequestInfo) -> Verdict:
        verdict = from_headers(info.headers, self.max_defer)
        if verdict is not None:
            return verdict
        for i, rule in enumerate(self.rules, 1):
            if matches(rule, info):
                return Verdict(rule.action, rule.max_wait, f"rule {i}")
        if self.hook is not None:
            verdict = self._ask_hook(info)
            if verdict is not None:
                return verdict
        return REALTIME

    def max_wait(self, verdict: Verdict) -> float:
        return self.default_max_wait if verdict.max_wait is None else verdict.max_wait

    def _bounded(self, wait: float) -> float:
        """The operator's hook may not promise more than the operator's own bound."""
        return min(wait, self.max_defer)

    def _ask_hook(self, info: RequestInfo) -> Verdict | None:
        try:
            return self._verdict_of_hook(info)
        except ValueError as err:  # a max_wait that is no duration
            log.warning("gateway: the classifier answered a bad max_wait (%s); request treated as if it had no opinion", err)
            return None

    def _verdict_of_hook(self, info: RequestInfo) -> Verdict | None:
        try:
            answer = self.hook(info)  # type: ignore[misc]
        except Exception as err:  # the request goes on; the hook's bug is logged, not the prompt
            log.warning("gateway: the classifier raised %s; request treated as if it had no opinion", type(err).__name__)
            return None
        if answer is None:
            return None
        if isinstance(answer, Verdict):
            wait = None if answer.max_wait is None else self._bounded(parse_duration(answer.max_wait))
            return Verdict(answer.mode, wait, "classifier")
        if isinstance(answer, str):
            answer = {"mode": answer}
        if isinstance(answer, Mapping) and answer.get("mode") in MODES:
            wait = answer.get("max_wait")
            return Verdict(answer["mode"], None if wait is None else self._bounded(parse_duration(wait)), "classifier")
        log.warning("gateway: the classifier answered %s, not a Verdict, a mode or None; ignored", type(answer).__name__)
        return None


def from_headers(headers: Mapping[str, str], max_defer: float = 86400.0) -> Verdict | None:
    """The client's own say (header names are lower-case here, as Starlette gives them)."""
    priority = headers.get("x-lowtide-priority")
    if priority is not None:
        if priority.strip().lower() != "realtime":
            raise PolicyError(f"X-Lowtide-Priority: the only value is 'realtime'; got {priority!r}")
        return Verdict("realtime", source="header")
    defer = headers.get("x-lowtide-defer")
    if defer is None:
        return None
    try:
        wait = parse_duration(defer)
    except ValueError as err:
        raise PolicyError(f"X-Lowtide-Defer: {err}") from None
    if wait > max_defer:
        raise PolicyError(f"X-Lowtide-Defer: at most {describe_duration(max_defer)} on this gateway (max_defer); "
                          f"got {defer[:40]!r}")  # fmt: skip
    prefer = headers.get("x-lowtide-prefer")
    if prefer is not None and prefer.strip().lower() not in ("realtime", "batch"):
        raise PolicyError(f"X-Lowtide-Prefer: give 'realtime' (or 'batch', the default); got {prefer!r}")
    mode: Mode = "prefer_realtime" if prefer is not None and prefer.strip().lower() == "realtime" else "defer"
    return Verdict(mode, wait, "header")


def matches(rule: Rule, info: RequestInfo) -> bool:
    m = rule.match
    if m.tenant is not None and m.tenant != info.tenant:
        return False
    if m.model is not None and not fnmatch.fnmatchcase(info.model, m.model):
        return False
    if m.path is not None and m.path != info.path:
        return False
    if m.tag is not None and m.tag not in info.tags:
        return False
    if m.metadata:
        given = info.body.get("metadata")
        if not isinstance(given, Mapping) or any(given.get(k) != v for k, v in m.metadata.items()):
            return False
    return True


def tags_of(headers: Mapping[str, str]) -> tuple[str, ...]:
    raw = headers.get("x-lowtide-tag")
    return tuple(t.strip() for t in raw.split(",") if t.strip()) if raw else ()
