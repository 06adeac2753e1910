"""What a deferred call's batch target can carry, asked before the 202 (DESIGN invariant 8).

A flush's job runs each body on the API's batch route and, near a deadline, on its
fallback route; the loader asks both routes' `refusal` and refuses the whole flush if
either objects. The same question is put here to each call as it arrives, with the model
each lane would run it on, so a body a lane cannot honour is refused alone (HTTP 400
naming the field and the route) and never stored, rather than failing its whole flush later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lowtide.core.types import Refusal, Request
from lowtide.routes import create_route
from lowtide.server.gateway.config import BatchTarget
from lowtide.server.gateway.shape import ENDPOINT


@dataclass(frozen=True, slots=True)
class Lane:
    route: str
    refusal: Callable[[Request], Refusal | None] | None  # None: a plugin route that does not say
    model: Callable[[str], str]  # the client's model → the model this lane runs it on


@dataclass(frozen=True, slots=True)
class Refused:
    """A call a lane cannot honour: the field and the message naming it and the route."""

    field: str
    message: str


class Admission:
    def __init__(self, api: str, lanes: list[Lane]):
        self.endpoint = ENDPOINT[api]
        self.lanes = lanes

    def refused(self, body: dict[str, Any]) -> Refused | None:
        model = body.get("model") if isinstance(body.get("model"), str) else ""
        for lane in self.lanes:
            if lane.refusal is None:
                continue
            refusal = lane.refusal(Request("", self.endpoint, body | {"model": lane.model(model)}))
            if refusal is not None:
                return Refused(refusal.field, refusal.message(lane.route))
        return None


def admission_for(api: str, target: BatchTarget, fallback: tuple[str, dict[str, Any], str | None] | None,
                  given: dict[str, Any]) -> Admission:  # fmt: skip
    """The lanes a flush of `api` has (collector.job_spec builds the same job): the target
    route under the model mapping, then the fallback under its model or the client's."""
    models = target.models or {}
    lanes = [Lane(target.route, _refusal(target.route, target.route_options, given), lambda m: models.get(m, m))]
    if fallback is not None and fallback[0] != target.route:
        route, options, fb_model = fallback
        lanes.append(Lane(route, _refusal(route, options, given), lambda m: fb_model or m))
    return Admission(api, lanes)


def _refusal(name: str, options: dict[str, Any], given: dict[str, Any]) -> Callable[[Request], Refusal | None] | None:
    route = given.get(name) or create_route(name, options)
    return getattr(route, "refusal", None)
