"""What the engine knows about one job while it works on it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Row

from lowtide.core.spec import JobSpec
from lowtide.core.states import JobState


@dataclass(slots=True)
class JobContext:
    id: int
    name: str
    state: JobState
    spec: JobSpec

    @classmethod
    def from_row(cls, row: Row) -> JobContext:
        return cls(row.id, row.name, JobState(row.state), JobSpec.model_validate_json(row.spec))

    @property
    def lanes(self) -> list[Lane]:
        """Where this job's requests run: its route; and its fallback route, if it has one."""
        spec = self.spec
        if spec.fallback is None:
            return [Lane(None, spec.route, spec.route_options, None)]
        fb = spec.fallback
        return [Lane("main", spec.route, spec.route_options, None), Lane("fallback", fb.route, fb.route_options, fb.model)]

    def priced_as(self, route: str) -> tuple[str, dict]:
        """The model and route options of the lane that runs on `route`, as the spec says
        now: what a budget estimates with. The fallback route differs from the job's, so
        the route tells. (Attempts are priced by `sent_as`.)"""
        spec = self.spec
        fb = spec.fallback
        if fb is not None and route == fb.route:
            return spec.fallback_model, fb.route_options
        return spec.model, spec.route_options

    def sent_as(self, route: str) -> tuple[dict, str | None]:
        """The route options of the lane that runs on `route`, and the model that lane sends
        instead of each request's own (the fallback's `model`), if any. Without one, an
        attempt is priced as its request's stored model, never the spec's, which may have
        changed since the request was rendered."""
        fb = self.spec.fallback
        if fb is not None and route == fb.route:
            return fb.route_options, fb.model
        return self.spec.route_options, None


@dataclass(frozen=True, slots=True)
class Lane:
    """One route of a job. `name` is the requests' lane ("main" or "fallback"), None for a
    job with one route; `model` overrides the requests' model on this route."""

    name: str | None
    route: str
    options: dict
    model: str | None

    @property
    def route_key(self) -> str:
        """Lanes with the same route and options share one route instance."""
        return self.route + ":" + repr(sorted(self.options.items()))
