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
    def route_key(self) -> str:
        """Jobs with the same route and options share one route instance."""
        return self.spec.route + ":" + repr(sorted(self.spec.route_options.items()))
