"""`lowtide render`: a job's first rows, or one row, rendered exactly as `load_job` stores
them, and nothing stored or sent.

Each row goes through the loader's own `RowRenderer`, so a body shown is the body of the
payload `load_job` would store, byte for byte, and a row it would refuse is shown with the
loader's own message. Each route the requests may run on (the job's route and its fallback,
or a decided `route: auto` job's tiers) is asked whether it refuses the body, where it can be
asked here: a route that cannot be built without its API key is listed as not asked, and
the rest of the spec is still checked as `check_job` checks it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lowtide.core import fastjson
from lowtide.core.auto_spec import AUTO
from lowtide.core.errors import RouteError, SourceError, SpecError, UnknownRouteError
from lowtide.core.ids import custom_id_for, key_of
from lowtide.core.sources import Source, SourceRow
from lowtide.core.spec import JobSpec
from lowtide.core.templates import MessageTemplate
from lowtide.core.types import Request
from lowtide.engine.loader import (
    FIX,
    Refused,
    RowRenderer,
    _refused,
    check_ask,
    check_job,
    open_source,
)
from lowtide.engine.preflight import check_model, check_prices
from lowtide.routes import create_route

DEFAULT_ROWS = 3


@dataclass(frozen=True, slots=True)
class RouteVerdict:
    """What one route says of a rendered body: it takes it, refuses it, or was not asked."""

    route: str
    refusal: str | None = None  # the route's refusal, as the loader words it
    not_asked: str | None = None  # why the route could not be asked here (no API key, say)

    def as_json(self) -> dict[str, Any]:
        verdict = "not asked" if self.not_asked else "refuses" if self.refusal else "takes"
        return {"route": self.route, "verdict": verdict, "message": self.refusal or self.not_asked}


@dataclass(slots=True)
class RenderedRow:
    row: int  # the source's 1-based data row
    id: str | None  # the row's id (source.id_column), as the loader reads it
    custom_id: str | None
    endpoint: str
    body: dict[str, Any] | None  # the body the store would hold; None when the row does not render
    problem: str | None = None  # the loader's refusal of the row: `lowtide run` would store nothing
    routes: list[RouteVerdict] = field(default_factory=list)
    variant: str | None = None  # an eval's variant


@dataclass(slots=True)
class Rendering:
    spec: JobSpec
    rows: list[RenderedRow]
    problems: list[str]  # rows the source cannot read as rows (the loader refuses them too)
    notes: list[str]

    @property
    def refused(self) -> int:
        return sum(1 for r in self.rows if r.problem) + len(self.problems)


def render_rows(spec: JobSpec, where: str = "job spec", first: int = DEFAULT_ROWS, row_id: str | None = None) -> Rendering:
    """The first `first` rows of the job's source (or the row whose id, or custom_id, is
    `row_id`), rendered as `load_job` renders them; see the module doc."""
    notes: list[str] = []
    if spec.route == AUTO and spec.auto is not None:  # decided when it is stored (engine/auto.py)
        c = spec.auto.candidates[0]
        spec = spec.model_copy(update={"route": c.route, "route_options": c.route_options})
        notes.append(f"route: auto is decided when the job is stored; shown as on its first candidate, {c.route}")
    template, source, lanes = _open(spec, where)
    verdict = RowRenderer(spec, template, source)  # the loader's renderer, routes' checks and all
    shown = RowRenderer(spec, template, source, routes_checked=True)  # a refused row's body, to show
    id_column = spec.source.id_column
    rows: list[RenderedRow] = []
    for row in _rows(source, first if row_id is None else None):
        key = _key(row, id_column)
        if row_id is not None and (key is None or row_id not in (key, _custom_id(key, spec.variant))):
            continue
        item = verdict(row)
        problem = None
        if isinstance(item, str):
            problem, item = item, None
        elif isinstance(item, Refused):
            problem = _refused(source, {item.message: [item.row]})[0]
            made = shown(row)
            item = made if isinstance(made, dict) else None
        body = fastjson.loads(item["payload"])["body"] if item is not None else None
        checks = [lane(body) for lane in lanes] if body is not None else []
        custom_id = item["custom_id"] if item is not None else None
        rows.append(RenderedRow(row.number, key, custom_id, spec.request_endpoint, body, problem, checks, spec.variant))
        if row_id is not None or len(rows) >= first:
            break
    if row_id is not None and not rows:
        raise SourceError(
            f'{source.label}: no row with id "{row_id}" (column "{id_column}", or a custom_id); '
            f"`lowtide render {where}` shows the first rows and their ids"
        )
    if not rows and not source.problems:
        raise SourceError(f"source {source.label} has no rows; `lowtide run` would store nothing. Fill the file, or point source.path at the right one")
    return Rendering(spec, rows, list(source.problems), notes)


def _rows(source: Source, first: int | None) -> Iterator[SourceRow]:
    """The source's rows, read `first` at a time when only the first are wanted."""
    for chunk in source.chunks(size=first or 5000, strict=False):  # a bad row: in source.problems
        yield from chunk


def _custom_id(key: str, variant: str | None) -> str | None:
    try:
        return custom_id_for(key_of(key), variant)
    except Exception:  # an id the loader refuses (said when the row renders)
        return None


def _key(row: SourceRow, id_column: str) -> str | None:
    key = row.values.get(id_column)
    return None if key is None or isinstance(key, dict | list) or not str(key).strip() else str(key).strip()


Lane = Callable[[dict[str, Any]], RouteVerdict]


def _open(spec: JobSpec, where: str) -> tuple[MessageTemplate, Source, list[Lane]]:
    """What `check_job` checks, and each route's check of a body. Where every route can be
    built here it is `check_job` itself; a route that needs a key not set here is left out
    of the checks that need it built, and is listed as not asked."""
    lanes: list[Lane] = []
    unbuilt = False
    endpoint, choices, schema = spec.request_endpoint, spec.effective_choices, spec.response_schema
    for name, options, model in spec.sending_routes:
        try:
            route = create_route(name, options)
        except UnknownRouteError:
            raise
        except RouteError as err:  # most often: its API key is not set here
            unbuilt = True
            lanes.append(lambda body, name=name, why=str(err): RouteVerdict(name, not_asked=why))
            continue
        try:
            route.check_model(model or spec.model)
        except RouteError as err:
            raise SpecError(f"{where}: {err}") from None
        refusal = getattr(route, "refusal", None)
        if refusal is None:  # a plugin route that does not say: it takes what it is sent
            lanes.append(lambda body, name=name: RouteVerdict(name, not_asked="the route does not check bodies before sending"))
            continue

        def lane(body: dict[str, Any], refusal=refusal, name=name, model=model) -> RouteVerdict:
            # As the loader's `refusal_checks` asks it.
            refused = refusal(Request("", endpoint, body | {"model": model} if model else body, choices, schema))
            return RouteVerdict(name, refusal=None if refused is None else refused.message(name) + FIX)

        lanes.append(lane)
    if not unbuilt:
        template, source = check_job(spec, where)
        return template, source, lanes
    template = MessageTemplate.from_spec(spec, where)  # check_job's checks, less the unbuilt routes
    check_prices(spec, where)
    check_model(spec, where)
    check_ask(spec, where)
    source = open_source(spec, template)
    return template, source, lanes
