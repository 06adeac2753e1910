"""`route: auto`: the job names candidate routes and how long its work may wait; lowtide
takes the cheapest candidate expected to make it (engine/auto.py, docs/routing.md).

    route: auto
    auto:
      max_wait: 2h                 # 90s, 45m, 2h, 1d, a number of seconds, or `deadline`
      candidates:
        - {route: openai-batch}
        - {route: openai, route_options: {service_tier: flex}}
        - {route: openai}
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

AUTO = "auto"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*$")
_UNIT = {None: 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(value: str | float | int) -> float:
    """Seconds of `90s`, `45m`, `2h`, `1d` or a plain number of seconds; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("give a duration such as 90m, 2h or 1d")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(f"{value!r} is not a duration; give e.g. 90m, 2h, 1d, or `deadline`")
        seconds = float(match.group(1)) * _UNIT[match.group(2)]
    if seconds <= 0:
        raise ValueError("give a duration above 0, e.g. 2h")
    return seconds


def duration_text(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h".replace(".0 h", " h")
    return f"{seconds / 86400:.1f} d".replace(".0 d", " d")


def route_label(route: str, options: dict[str, Any]) -> str:
    """A route as the choice's reasons name it: `openai (flex)` for a service tier."""
    tier = options.get("service_tier")
    return f"{route} ({tier})" if isinstance(tier, str) and tier not in ("auto", "default") else route


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CandidateSpec(_Strict):
    route: str
    route_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("route")
    @classmethod
    def _not_auto(cls, v: str) -> str:
        if v == AUTO:
            raise ValueError("a candidate is a route that runs requests, not `auto`")
        return v

    @property
    def label(self) -> str:
        return route_label(self.route, self.route_options)


class TierSpec(_Strict):
    """One tier of a decided job's chain (engine/tiers.py): a candidate, and how many seconds
    before the end of max_wait it takes over from the tier before it (0 for the first)."""

    route: str
    route_options: dict[str, Any] = Field(default_factory=dict)
    margin: float = Field(0.0, ge=0)

    @property
    def label(self) -> str:
        return route_label(self.route, self.route_options)


class AutoSpec(_Strict):
    # How long the job's work may wait: a duration from when it is submitted, or `deadline`
    # (the job's own deadline).
    max_wait: str | float
    candidates: list[CandidateSpec] = Field(min_length=1)
    # Set by lowtide when it decides (engine/auto.py): the route taken. Not for specs.
    chosen: str | None = None
    # Set by lowtide with `chosen` when the choice is a batch route with faster candidates:
    # the chosen tier first, then each faster one it hands over to (docs/routing.md).
    chain: list[TierSpec] | None = None
    # Set by lowtide with `chain`: when max_wait ends (epoch seconds). The chain works to it,
    # or to the job's own deadline where that is sooner: a later submission's deadline is
    # held against it (engine/auto.py `resolve`).
    ends_at: float | None = None

    @field_validator("max_wait")
    @classmethod
    def _max_wait(cls, v: str | float) -> str | float:
        if v != "deadline":
            parse_duration(v)
        return v

    @model_validator(mode="after")
    def _distinct(self) -> AutoSpec:
        seen = [(c.route, repr(sorted(c.route_options.items()))) for c in self.candidates]
        if len(set(seen)) != len(seen):
            raise ValueError("candidates must differ (route or route_options): one is given twice")
        return self

    def undecided(self) -> AutoSpec:
        return self.model_copy(update={"chosen": None, "chain": None, "ends_at": None})

    def wait_seconds(self) -> float | None:
        """`max_wait` in seconds; None when it is the job's deadline."""
        return None if self.max_wait == "deadline" else parse_duration(self.max_wait)
