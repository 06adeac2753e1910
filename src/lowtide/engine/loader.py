"""Render and persist a job's rows: the first step, and the only one that reads the source.

Everything happens in one transaction: if any row is bad, every problem is reported (file,
row, field, fix) and nothing in the store changes (DESIGN invariant 7). Rows whose custom_id
is already stored are left as they are, so loading the same file twice adds nothing.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, func, select
from sqlalchemy.dialects import postgresql, sqlite

from lowtide.core import fastjson
from lowtide.core.clock import Clock
from lowtide.core.errors import RouteError, SourceError, SpecError, UnknownRouteError
from lowtide.core.ids import custom_id_for
from lowtide.core.sources import Source, SourceRow
from lowtide.core.spec import JobSpec
from lowtide.core.states import JobState, RequestState
from lowtide.core.templates import MessageTemplate
from lowtide.engine import budget
from lowtide.routes import create_route
from lowtide.store.bulk import executemany
from lowtide.store.db import Store
from lowtide.store.queries import add_event, save_job
from lowtide.store.schema import jobs, requests
from lowtide.store.transitions import move_job

MAX_PROBLEMS = 1000
_dumps = fastjson.dumps
# Rows that carry their own conversation may also carry these generation parameters.
ROW_PARAMS = ("max_tokens", "temperature", "stop")


@dataclass(slots=True)
class LoadReport:
    job_id: int
    created: bool
    rows: int
    new: int

    @property
    def known(self) -> int:
        return self.rows - self.new


class RowRenderer:
    """Turns one source row into a request row, or a problem description."""

    def __init__(self, spec: JobSpec, template: MessageTemplate, source: Source):
        self.spec = spec
        self.template = template
        self.source = source
        self.id_column = spec.source.id_column
        self.required = {v: w for v, w in template.variables.items() if v not in spec.source.optional_columns}
        self.optional = dict.fromkeys(spec.source.optional_columns)
        self.row_params = spec.template.messages_column is not None
        self.base = {"model": spec.model, "max_tokens": spec.params.max_tokens, "temperature": spec.params.temperature}
        if spec.params.stop:
            self.base["stop"] = spec.params.stop
        if spec.response_schema is not None:
            self.base["response_schema"] = spec.response_schema
        if spec.effective_choices:
            self.base["choices"] = spec.effective_choices
        self.prefix = _dumps(self.base)[:-1] + ', "messages": '

    def __call__(self, row: SourceRow) -> dict | str:
        values = row.values
        key = values.get(self.id_column)
        if key is None or (key := str(key).strip()) == "":
            what = "is empty" if self.id_column in values else "is missing"
            return f'{self.where(row)}: id column "{self.id_column}" {what}; every row needs a unique id (source.id_column)'
        if not key.isascii() and not _is_utf8(key):
            return f'{self.where(row)}: id {key!r} in column "{self.id_column}" is not valid Unicode (a lone surrogate); fix the id in the source'
        if self.optional:  # a row (JSONL) may leave an optional column out altogether
            values = {**self.optional, **values}
        for var, used_at in self.required.items():
            value = values.get(var, ...)  # a missing key is the template's error to name
            if value is None or (value.__class__ is str and not value.strip()):
                return (
                    f'{self.where(row)}: column "{var}" is empty; the template uses it ({used_at}). '
                    "Fill it in, or list it in source.optional_columns"
                )
        try:
            messages = self.template.render(values, row, self.where)
        except Exception as err:  # TemplateError already names row and line
            return str(err)
        if self.row_params and any(values.get(k) is not None for k in ROW_PARAMS):
            own = {k: values[k] for k in ROW_PARAMS if values.get(k) is not None}
            payload = _dumps({**self.base, **own, "messages": messages})
        else:  # the fixed part of the payload is serialised once per job, not once per row
            payload = self.prefix + _dumps(messages) + "}"
        return {"custom_id": custom_id_for(key), "source_key": key, "source_row": row.number, "payload": payload}

    def where(self, row: SourceRow) -> str:
        return row.where(self.source.path)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_job(spec: JobSpec, where: str = "job spec") -> tuple[MessageTemplate, Source]:
    """Everything about a job that can be checked without reading its rows."""
    template = MessageTemplate.from_spec(spec, where)
    try:
        create_route(spec.route, spec.route_options).check_model(spec.model)
        if spec.fallback is not None:
            create_route(spec.fallback.route, spec.fallback.route_options).check_model(spec.fallback_model)
    except UnknownRouteError:
        raise
    except RouteError as err:  # a wrong model or option is a problem with the spec
        raise SpecError(f"{where}: {err}") from None
    source = Source(spec.resolve(spec.source.path), spec.source.format)
    if source.columns is not None:
        if spec.source.id_column not in source.columns:
            raise SourceError(
                f'{source.path}: no column "{spec.source.id_column}" (source.id_column); '
                f"columns are: {', '.join(source.columns)}"
            )
        template.check_columns(source.columns, source.path.name)
    return template, source


def load_job(
    store: Store,
    spec: JobSpec,
    clock: Clock,
    where: str = "job spec",
    on_rows: Callable[[int], None] | None = None,
) -> LoadReport:
    """Validate, render and persist every row of the job's source; see the module doc."""
    template, source = check_job(spec, where)
    render = RowRenderer(spec, template, source)
    insert_requests = (postgresql.insert if not store.is_sqlite else sqlite.insert)(requests)
    insert_requests = insert_requests.on_conflict_do_nothing(index_elements=["job_id", "custom_id"])
    now = clock.now()
    with store.begin() as conn:
        job_id, created = save_job(conn, spec.name, spec.model_dump_json(), spec.route, now)
        budget.resume(conn, job_id, spec.budget_usd, now)  # a budget_exhausted job, submitted again
        before = _count(conn, job_id)
        ids = _IdWatch()
        problems: list[str] = []
        total = 0
        for chunk in source.chunks():
            good = []
            for row in chunk:
                item = render(row)
                if isinstance(item, str):
                    problems.append(item)
                else:
                    item.update(job_id=job_id, state=RequestState.PENDING.value, attempts=0, not_before=0.0)
                    good.append(item)
            total += len(chunk)
            for g in good:  # ids are watched even after a problem: duplicates are reported with the rest
                ids.add(g["custom_id"])
            if good and not problems:
                executemany(conn, insert_requests, good)
            if on_rows:
                on_rows(total)
            if len(problems) >= MAX_PROBLEMS:
                break
        if ids.has_repeats():
            problems.extend(_duplicates(source, spec.source.id_column, ids))
        if problems:
            raise SourceError.from_problems(f"{source.path}: refused, nothing was stored", problems)
        new = _count(conn, job_id) - before
        if new:
            conn.execute(jobs.update().where(jobs.c.id == job_id).values(updated_at=now))
            move_job(conn, job_id, JobState.ACTIVE, finished_at=None)
            add_event(conn, job_id, "loaded", f"{new} new request(s) from {source.path.name} ({total} rows)", now)
    return LoadReport(job_id=job_id, created=created, rows=total, new=new)


def _count(conn: Connection, job_id: int) -> int:
    return conn.execute(select(func.count()).select_from(requests).where(requests.c.job_id == job_id)).scalar_one()


class _IdWatch:
    """Spots repeated custom_ids in a file of any size in 8 bytes a row: each id's hash goes
    into a flat array; repeats of a hash are checked against the real ids afterwards."""

    def __init__(self) -> None:
        self.hashes = array("q")
        self.repeated: set[int] = set()

    def add(self, custom_id: str) -> None:
        self.hashes.append(hash(custom_id))

    def has_repeats(self) -> bool:
        import pyarrow as pa
        import pyarrow.compute as pc

        # Straight from the array's buffer, and a max before any filter: `pa.array(...)` and
        # comparing with a Python number first import pandas (about 0.3 s), needed only when
        # some id does repeat.
        hashes = pa.Array.from_buffers(pa.int64(), len(self.hashes), [None, pa.py_buffer(self.hashes)])
        counts = pc.value_counts(hashes)
        if len(counts) == 0 or pc.max(counts.field("counts")).as_py() < 2:
            return False
        many = pc.filter(counts, pc.greater(counts.field("counts"), 1))
        self.repeated = set(many.field("values").to_pylist())
        return True


def _duplicates(source: Source, id_column: str, ids: _IdWatch) -> list[str]:
    """Every row of every repeated id: a second pass over the source, only when needed."""
    groups: dict[str, list[int]] = {}
    for chunk in source.chunks():
        for row in chunk:
            key = row.values.get(id_column)
            if key is None or not (key := str(key).strip()):
                continue
            cid = custom_id_for(key) if key.isascii() or _is_utf8(key) else None
            if cid is not None and hash(cid) in ids.repeated:
                groups.setdefault(cid, []).append(row.number)
    return [
        f'{source.path.name} rows {", ".join(map(str, rows))}: duplicate id "{cid}" in column "{id_column}"; '
        "ids must be unique (remove or renumber the repeats)"
        for cid, rows in sorted(groups.items())
        if len(rows) > 1
    ]
