"""What the engine knows about one job while it works on it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Row, select

from lowtide.core.auto_spec import route_label
from lowtide.core.spec import JobSpec, stored_spec
from lowtide.core.states import JobState
from lowtide.store.schema import jobs


@dataclass(slots=True)
class JobContext:
    id: int
    name: str
    state: JobState
    spec: JobSpec
    spec_text: str | None = None  # the stored spec as read (engine/batches.py `_begin_submit` compares it)

    @classmethod
    def from_row(cls, row: Row) -> JobContext:
        return cls(row.id, row.name, JobState(row.state), stored_spec(row.spec), row.spec)

    @classmethod
    def load(cls, conn: Connection, job_id: int) -> JobContext:
        return cls.from_row(conn.execute(select(jobs).where(jobs.c.id == job_id)).one())

    @property
    def lanes(self) -> list[Lane]:
        """Where this job's requests run: its route; and its fallback route, if it has one;
        or, for a decided `route: auto` job, each tier of its chain (engine/tiers.py)."""
        spec = self.spec
        if spec.chain:
            return [Lane(tier_lane(i), t.route, t.route_options, None) for i, t in enumerate(spec.chain)]
        if spec.fallback is None:
            return [Lane(None, spec.route, spec.route_options, None)]
        fb = spec.fallback
        return [Lane("main", spec.route, spec.route_options, None), Lane("fallback", fb.route, fb.route_options, fb.model)]

    def next_lane(self, lane: str) -> str | None:
        """The lane a request moves to when its own cannot finish it (engine/ingest.py): the
        fallback after main, the next tier up in a chain; None after the last."""
        names = [lane.name for lane in self.lanes]
        if len(names) < 2 or lane not in names:
            return None
        i = names.index(lane) + 1
        return names[i] if i < len(names) else None

    def priced_as(self, route: str) -> tuple[str, dict]:
        """The model and route options of the lane that runs on `route`, as the spec says
        now: what a budget estimates with. The fallback route differs from the job's, so
        the route tells; in a chain, tiers on one route (flex, then real time) are estimated
        at the last, dearest one: a budget holds as an upper bound. (Attempts are priced by
        `sent_as`.)"""
        spec = self.spec
        if spec.chain:
            on_route = [t for t in spec.chain if t.route == route]
            return spec.model, (on_route[-1].route_options if on_route else spec.route_options)
        fb = spec.fallback
        if fb is not None and route == fb.route:
            return spec.fallback_model, fb.route_options
        return spec.model, spec.route_options

    def sent_as(self, route: str, lane: str | None = None) -> tuple[dict, str | None]:
        """The route options of the lane that runs on `route`, and the model that lane sends
        instead of each request's own (the fallback's `model`), if any. Without one, an
        attempt is priced as its request's stored model, never the spec's, which may have
        changed since the request was rendered. In a chain `lane` tells tiers on one route
        apart (a direct dispatch's; a batch route is one tier of a chain at most)."""
        if self.spec.chain:
            lanes = [x for x in self.lanes if x.route == route]
            chosen = next((x for x in lanes if x.name == lane), lanes[0] if lanes else None)
            return (chosen.options if chosen else self.spec.route_options), None
        fb = self.spec.fallback
        if fb is not None and route == fb.route:
            return fb.route_options, fb.model
        return self.spec.route_options, None


@dataclass(frozen=True, slots=True)
class Lane:
    """One route of a job. `name` is the requests' lane ("main" or "fallback"; in a chain
    "main", "tier1", "tier2", …), None for a job with one route; `model` overrides the
    requests' model on this route."""

    name: str | None
    route: str
    options: dict
    model: str | None

    @property
    def label(self) -> str:
        return route_label(self.route, self.options)

    @property
    def route_key(self) -> str:
        """Lanes with the same route and options share one route instance."""
        return self.route + ":" + repr(sorted(self.options.items()))


def tier_lane(index: int) -> str:
    """The lane value of a chain's tier: "main" for the chosen one (where new and retried
    requests start), then "tier1", "tier2", … (the column holds 8 characters)."""
    return "main" if index == 0 else f"tier{index}"
