"""Render and persist a job's rows: the first step, and the only one that reads the source.

Everything happens in one transaction: if any row is bad, every problem is reported (file,
row, field, fix) and nothing in the store changes (DESIGN invariant 7). Rows whose custom_id
is already stored are left as they are, so loading the same file twice adds nothing.

Loading a job that is stored already compares (docs/jobs.md "Changing a job"): a spec
change that alters requests (model, params, template, choices, schema, route, fallback lane)
is refused unless `requeue_changed`; other spec changes are applied and listed, but a change
of where a route's batches live (base_url, api_key_env: `spec_changes.CONNECTION_OPTIONS`) is
refused, even with `requeue_changed`, while a batch of the job is sent there. A stored
request whose row now renders differently (its fingerprint) is counted and kept, or, with
`requeue_changed`, re-rendered and queued again (engine/changes.py).

A nightly increment (`source.since`) reads the rows past its watermark, or, with
`requeue_changed`, every row (a changed row is at or below it once stored). Ids it meets in
several rows are versions of one request: the load is rolled back and done again with each
id's newest row only (engine/versions.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING

import orjson
from sqlalchemy import Connection, Insert, bindparam, func, select
from sqlalchemy.dialects import postgresql, sqlite

from lowtide.core import fastjson, gemini_schema, shapes
from lowtide.core.anthropic_schema import schema_problem, sent_schema
from lowtide.core.auto_spec import AUTO
from lowtide.core.cards import routes_of
from lowtide.core.clock import Clock
from lowtide.core.endpoints import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    GEMINI,
    MESSAGES,
    MODERATIONS,
    RESPONSES,
    body_type,
    conversation_key,
    required_keys,
)
from lowtide.core.errors import RouteError, SourceError, SpecError, UnknownRouteError
from lowtide.core.fastjson import is_utf8
from lowtide.core.ids import custom_id_of
from lowtide.core.native_schema import anthropic_structured, ask_of, choice_tokens, with_ask
from lowtide.core.params import cast, check_row
from lowtide.core.sources import Source, SourceRow, Watermark, source_of
from lowtide.core.spec import JobSpec, stored_spec
from lowtide.core.spec_changes import SpecChanges, spec_changes
from lowtide.core.states import JobState, RequestState
from lowtide.core.templates import MessageTemplate
from lowtide.core.types import Request
from lowtide.engine import budget
from lowtide.engine.batches import end_watches
from lowtide.engine.carried import CarriedKeys
from lowtide.engine.changes import Changes, move_connections, note_changed, requeue, split_known
from lowtide.engine.context import JobContext
from lowtide.engine.embedding_rows import EmbeddingInput, ModerationInput
from lowtide.engine.notify import check_notify
from lowtide.engine.preflight import check_model, check_prices
from lowtide.engine.versions import IdWatch, Newest, repeated_rows, row_id
from lowtide.engine.watermarks import check_forward, save_watermark, stored_watermark
from lowtide.routes import create_route
from lowtide.store.bulk import executemany, fixed
from lowtide.store.db import Store
from lowtide.store.payloads import head_id as payload_head
from lowtide.store.queries import LIVE_DISPATCH_STATES, add_event, save_job
from lowtide.store.schema import dispatches, jobs, requests
from lowtide.store.transitions import move_job

if TYPE_CHECKING:
    from lowtide.engine.auto import Choice  # auto imports the loader

MAX_PROBLEMS = 1000
_dumps = fastjson.dumps
# Rows that carry their own conversation may also carry these generation parameters.
ROW_PARAMS = ("max_tokens", "temperature", "stop")
ROWS_NAMED = 10  # rows listed by number for a refusal many rows share


@dataclass(slots=True)
class LoadReport:
    job_id: int
    created: bool
    rows: int
    new: int
    changed: int = 0  # stored requests whose row or spec renders differently now
    requeued: int = 0  # of those, re-rendered and queued again (`requeue_changed`)
    applied: list[str] = field(default_factory=list)  # spec changes applied to the stored job
    watermark: str | None = None  # `source.since`: the highest value stored up to, after this load

    @property
    def known(self) -> int:
        return self.rows - self.new

    def changed_line(self) -> str | None:
        """What happened to changed rows, for `lowtide run` / `submit` to print."""
        if not self.changed:
            return None
        said = f"{self.changed} row(s) changed since they were stored: "
        if self.requeued:
            return said + f"re-queued {self.requeued} (their earlier answers are kept as earlier versions)"
        return said + "kept, with their earlier answers (pass --requeue-changed to re-run them)"


class RowRenderer:
    """Turns one source row into a request row, or a problem description."""

    def __init__(self, spec: JobSpec, template: MessageTemplate, source: Source, routes_checked: bool = False):
        self.spec = spec
        self.template = template
        self.source = source
        self.id_column = spec.source.id_column
        self.required = {v: w for v, w in template.variables.items() if v not in spec.source.optional_columns}
        self.optional = dict.fromkeys(spec.source.optional_columns)
        self.row_params = spec.template.messages_column is not None
        self.model = spec.model
        self.variant = spec.variant
        self.endpoint = spec.request_endpoint
        self.conversation = conversation_key(self.endpoint)
        self.ask = ask_of(spec.effective_choices, spec.response_schema)
        self.base = request_base(spec)
        own = {k: v for k, v in (("choices", spec.effective_choices), ("response_schema", spec.response_schema)) if v}
        self.own = own or None
        head = {"endpoint": self.endpoint} | ({"lowtide": own} if own else {})
        # The payload is `head` plus the body, written as text around each row's messages.
        self.prefix = _dumps(head)[:-1] + ', "body": ' + _dumps(self.base)[:-1] + f', "{self.conversation}": '
        # Where the loader stored `prefix` as the job's payload head (store/payloads.py), a row
        # whose body is the job's gives its own part alone, with this id; None: the whole text.
        self.head_id: int | None = None
        self.split_system = self.endpoint == MESSAGES
        # Embedding and moderation jobs: the rendered text is the body's `input`, checked for
        # emptiness (and an embedding's for length).
        self.input_text = (EmbeddingInput(spec) if self.endpoint == EMBEDDINGS
                           else ModerationInput() if self.endpoint == MODERATIONS else None)  # fmt: skip
        self.body_column = spec.template.body_column
        # `routes_checked`: the caller has asked the routes about every row already (lowtide
        # serve does, line by line, to fail a refused line alone).
        self.checks = [] if routes_checked else refusal_checks(spec)
        self.carried = CarriedKeys(spec)  # keys the SDK does not declare, sent as they are
        # A row's own conversation or body may lack a key the endpoint requires (Anthropic's
        # max_tokens) that the spec's params do not give: refused here, not by the provider.
        given = spec.template.messages_column is not None or spec.template.body_column is not None
        self.needed = sorted(required_keys(self.endpoint)) if given else []
        # {parameter: (column, the scalar type CSV text is read as, or None)}
        # (the SDK's types only where a column gives a parameter: reading them imports the SDK)
        types = shapes.fields(body_type(self.endpoint)) if spec.param_columns else {}
        csv = source.format == "csv"
        self.param_columns = {
            key: (column, shapes.scalar(types[key][0]) if csv and key in types else None) for key, column in spec.param_columns.items()
        }
        # The fingerprint of a request: what every request of the job is rendered with (the
        # payload's fixed part, the templates' text), then the values of the row it uses.
        # Hashing those, not the payload, lets the results check a row without rendering it.
        self.used = list(template.variables) + (list(ROW_PARAMS) if self.row_params else [])
        self.used += [c for c, _ in self.param_columns.values() if c not in self.used]
        # The job's part is the key of a keyed BLAKE2b, keyed once here: each row's hash starts
        # from a copy of it (keying costs a compression of its own; a copy costs less).
        self.fp_key = hashlib.blake2b(_canonical([self.prefix, template.sources, spec.template.messages_column, self.used])).digest()
        self.fp_keyed = hashlib.blake2b(digest_size=16, key=self.fp_key)
        # The used values in one C call (a tuple, written as the same JSON array as a list)
        # where the row has every used column; itemgetter of fewer than two gives no tuple.
        used = self.used
        self.pick_used = itemgetter(*used) if len(used) > 1 else lambda values: [values.get(k) for k in used]

    def __call__(self, row: SourceRow) -> dict | str:
        values = row.values
        key = values.get(self.id_column)
        if key.__class__ is dict or key.__class__ is list:  # a JSON row's id: str() would make one up
            what = "object" if key.__class__ is dict else "array"
            return f'{self.where(row)}: id in column "{self.id_column}" is a JSON {what}; an id is a string or a number: give the row a plain id'
        if key is None or (key := str(key).strip()) == "":
            what = "is empty" if self.id_column in values else "is missing"
            return f'{self.where(row)}: id column "{self.id_column}" {what}; every row needs a unique id (source.id_column)'
        if not key.isascii() and not is_utf8(key):
            return f'{self.where(row)}: id {key!r} in column "{self.id_column}" is not valid Unicode (a lone surrogate); fix the id in the source'
        if self.optional:  # a row (JSONL) may leave an optional column out altogether
            values = {**self.optional, **values}
        for var, used_at in self.required.items():
            value = values.get(var, ...)  # a missing key is the template's error to name
            # (`not value or value.isspace()`: `not value.strip()` without copying the text)
            if value is None or (value.__class__ is str and (not value or value.isspace())):
                return (
                    f'{self.where(row)}: column "{var}" is empty; the template uses it ({used_at}). '
                    "Fill it in, or list it in source.optional_columns"
                )
        files: list[str] = []  # the digests of the files the row's parts inline
        if self.body_column is not None:
            body = self.given_body(values.get(self.body_column), row)
            if isinstance(body, str):
                return body
            fixed = False
        else:
            try:
                messages = self.template.render(values, row, self.where, files)
            except Exception as err:  # TemplateError already names row and line
                return str(err)
            own = {k: values[k] for k in ROW_PARAMS if values.get(k) is not None} if self.row_params else None
            if self.param_columns:
                given = self.row_params_of(values, row)
                if isinstance(given, str):
                    return given
                own = (own or {}) | given if given else own
            if self.input_text is not None:
                messages, problem = self.input_text.text(messages, lambda: self.where(row))
                if problem is not None:
                    return problem
            body, fixed = self.body(messages, own)
        if self.needed and (missing := [k for k in self.needed if body.get(k) is None]):
            return Refused(self.missing(missing[0]), row.number)
        for check in self.checks:
            refused = check(body, fixed)
            if refused is not None:
                return Refused(refused, row.number)
        self.carried.see(body)
        head = None
        if fixed and self.head_id is not None:  # the job's head is stored once: the row's own part alone
            payload, head = _dumps(body[self.conversation]), self.head_id
        elif fixed:  # the fixed part of the payload is serialised once per job, not once per row
            payload = f"{self.prefix}{_dumps(body[self.conversation])}}}}}"  # one string built, not two
        else:
            payload = _dumps({"endpoint": self.endpoint} | ({"lowtide": self.own} if self.own else {}) | {"body": body})
        if not payload.isascii() and not is_utf8(payload):  # a JSON "\ud800" in a cell: no store can keep it
            return self.surrogate(values, row)
        return {
            "custom_id": custom_id_of(key, self.variant), "source_key": key, "source_row": row.number,
            "payload": payload, "head_id": head, "model": self.model, "fingerprint": self.fingerprint(values, files),
        }  # fmt: skip

    def surrogate(self, values: dict, row: SourceRow) -> str:
        """The problem with a row whose request holds a lone surrogate, naming its column."""
        columns = [k for k in self.used if not is_utf8(v if (v := values.get(k)).__class__ is str else _dumps(v))]
        where = f'column "{columns[0]}"' if columns else "a value"
        return f"{self.where(row)}: {where} holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is not valid Unicode; fix the cell in the source"

    def row_params_of(self, values: dict, row: SourceRow) -> dict | str:
        """The body parameters this row's `param_columns` give (an empty cell gives none:
        the spec's params value stands), or the problem with one."""
        out = {}
        for key, (column, kind) in self.param_columns.items():
            value = values.get(column)
            if value is None or (value.__class__ is str and not value.strip()):
                continue
            if value.__class__ is str and kind is not None:
                try:
                    value = cast(value, kind)
                except ValueError:
                    return f'{self.where(row)}: column "{column}" (param_columns.{key}): {value!r} is not {shapes.said(kind)}; fix the cell'
            out[key] = value
        if out:
            try:
                check_row(out, self.base, self.endpoint)
            except ValueError as err:
                return f"{self.where(row)}: param_columns: {err}"
        return out

    def given_body(self, value: object, row: SourceRow) -> dict | str:
        """A row's own request body, with the job's model; or the problem with it."""
        column = self.body_column
        if isinstance(value, str):
            try:
                value = fastjson.loads(value)
            except ValueError as err:
                return f'{self.where(row)}: column "{column}" is not JSON ({err}); it must hold a request body of {self.endpoint}'
        if not isinstance(value, dict):
            return f'{self.where(row)}: column "{column}" must hold a JSON object: a request body of {self.endpoint}'
        value = value | {"model": self.model}
        return value if self.ask is None else with_ask(value, self.endpoint, self.ask)

    def body(self, messages: list[dict], own: dict | None) -> tuple[dict, bool]:
        """The request body for these messages, and whether it is the job's fixed part plus
        the messages as they are (then the payload is written around them, not rebuilt)."""
        if self.endpoint == COMPLETIONS:  # a prompt is text: the rendered parts, joined
            return {**self.base, **(own or {}), "prompt": "\n\n".join(m["content"] for m in messages)}, False
        if self.input_text is not None:  # `messages` is the body's text `input` (see __call__)
            return ({**self.base, **own, "input": messages}, False) if own else ({**self.base, "input": messages}, True)
        body = {**self.base, **own} if own else dict(self.base)
        fixed = not own
        if self.split_system and any(m["role"] == "system" for m in messages) and _text_system(messages):  # Anthropic: system apart
            body["system"] = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
            messages = [m for m in messages if m["role"] != "system"]
            fixed = False
        body[self.conversation] = messages
        return body, fixed

    def fingerprint(self, values: dict, files: list[str] | None = None) -> str:
        """32 hex digits for what a row with these values renders as (see __init__);
        `values` with the optional columns filled in, as `__call__` has them. A file a path
        cell names is inlined: its bytes are part of what the row renders from, by `files`,
        their digests as the render read them (each file read and hashed here if not given)."""
        if files is None:
            files = self.template.file_digests(values) if self.template.media else []
        try:
            used = self.pick_used(values)
        except KeyError:  # a column the row leaves out (JSONL) is read as None
            used = [values.get(k) for k in self.used]
        if files:  # a row that inlines no file has the fingerprint it had before files were hashed
            used = [*used, files]
        hasher = self.fp_keyed.copy()
        hasher.update(_canonical(used))
        return hasher.hexdigest()

    def fingerprints(self, rows: list[dict]) -> list[str]:
        """`fingerprint` of each of these values, in one loop of bound names: the export
        checks every row of a job (~0.2 µs a row less than a call each). A row the loop
        cannot hash as it is (a column left out, a value orjson cannot write) is hashed by
        `fingerprint`."""
        if self.template.media:  # files to read and hash
            return [self.fingerprint(values) for values in rows]
        pick, keyed, dumps, one = self.pick_used, self.fp_keyed, orjson.dumps, self.fingerprint
        out: list[str] = []
        append = out.append
        for values in rows:
            try:
                text = dumps(pick(values), default=str)
            except (KeyError, TypeError):
                append(one(values))
                continue
            hasher = keyed.copy()
            hasher.update(text)
            append(hasher.hexdigest())
        return out

    def values_of(self, row: SourceRow) -> dict:
        return {**self.optional, **row.values} if self.optional else row.values

    def where(self, row: SourceRow) -> str:
        return row.where(self.source.name)

    def missing(self, key: str) -> str:
        own = f'in column "{self.body_column}"' if self.body_column is not None else f'as the row\'s "{key}" column'
        return (f"{key} is required by {self.endpoint} and the request has none; "
                f"set params.{key} in the spec (e.g. params: {{{key}: 1024}}), or give it {own}")  # fmt: skip


def _text_system(messages: list[dict]) -> bool:
    """Whether every system turn is text: those become Anthropic's `system`, as one text.
    A system turn of blocks (a row's own conversation) is kept where the row put it."""
    return all(m["content"].__class__ is str for m in messages if m["role"] == "system")


@dataclass(frozen=True, slots=True)
class Refused:
    """A row whose request a route cannot honour: grouped with the rows refused alike."""

    message: str
    row: int


def request_base(spec: JobSpec) -> dict:
    """The body every request of the job starts from: the model, the params as given, and
    the job's `choices` or `response_schema` in the endpoint's own structured-output field
    where it has one and params did not set one (core/native_schema.py)."""
    base = {"model": spec.model, **spec.params}
    ask = ask_of(spec.effective_choices, spec.response_schema)
    return base if ask is None else with_ask(base, spec.request_endpoint, ask)


def refusal_checks(spec: JobSpec) -> list[Callable[[dict, bool], str | None]]:
    """For the job's route and its fallback's (or its chain's tiers): a body's refusal message,
    or None. A check is told whether the body is the job's fixed part plus its turns (`fixed`):
    where the route says such turns leave the refusal to the rest of the body (`rest_decides`),
    the rest is the same in every such row, and the route is asked once, not once per row."""
    checks = []
    lanes = spec.sending_routes
    endpoint, choices, schema = spec.request_endpoint, spec.effective_choices, spec.response_schema
    conversation = conversation_key(endpoint)
    for name, options, model in lanes:
        try:
            route = create_route(name, options)
        except RouteError:  # no key here (an estimate): `check_job` refuses such a spec before a load
            continue
        refusal = getattr(route, "refusal", None)
        if refusal is None:  # a plugin route that does not say: it takes what it is sent
            continue
        decides = getattr(route, "rest_decides", None)
        said: list[str | None] = []  # the refusal of the job's fixed part, once asked

        def check(body: dict, fixed: bool = False, refusal=refusal, name=name, model=model, decides=decides, said=said) -> str | None:
            if fixed and said and decides(endpoint, body.get(conversation)):
                return said[0]
            refused = refusal(Request("", endpoint, body | {"model": model} if model else body, choices, schema))
            message = None if refused is None else refused.message(name) + FIX
            if fixed and not said and decides is not None and decides(endpoint, body.get(conversation)):
                said.append(message)
            return message

        checks.append(check)
    return checks


FIX = "; change the spec's params or template, or send the job to a route that takes it"


def _canonical(value) -> bytes:
    """Stable bytes for hashing: JSON, anything JSON has no type for (a Decimal, a
    timestamp of a Parquet column) as its text."""
    try:
        return orjson.dumps(value, default=str)
    except TypeError:  # an integer beyond 64 bits, a lone surrogate
        return json.dumps(value, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")


# Routes that send a job's `choices` to a provider as JSON `{"choice": ...}` (OpenAI's and
# Anthropic's structured outputs take an object): the wrapper counts against the output limit.
WRAPPING_ROUTES = frozenset(routes_of("openai") + routes_of("anthropic"))  # by their cards (core/cards.py)
WRAPPED_ENDPOINTS = frozenset({CHAT, RESPONSES, MESSAGES})
ANTHROPIC_ROUTES = frozenset(routes_of("anthropic"))
GEMINI_ROUTES = frozenset(routes_of("gemini"))


def check_ask(spec: JobSpec, where: str) -> None:
    """Refuse what the native ask of `choices` / `response_schema` (core/native_schema.py)
    cannot carry: both at once, or an output limit too short for a choice in its wrapper."""
    if spec.choices and spec.response_schema is not None:
        raise SpecError(
            f"{where}: choices and response_schema are both set; an answer is either one of the choices or JSON "
            "valid against the schema. Keep one (a schema with an enum at its root counts as choices)"
        )
    check_native_schema(spec, where)
    choices, limit = spec.effective_choices, spec.output_limit
    if not choices or limit is None or spec.request_endpoint not in WRAPPED_ENDPOINTS:
        return
    need = choice_tokens(choices)
    wrapping = [name for name, _, _ in spec.sending_routes if name in WRAPPING_ROUTES]
    if wrapping and limit < need:
        raise SpecError(
            f'{where}: params sets an output limit of {limit} token(s); route {wrapping[0]} asks for the choice as '
            f'JSON {{"choice": ...}}, which needs up to {need}. Raise the limit to {need} (the answer is still one choice)'
        )


def check_native_schema(spec: JobSpec, where: str) -> None:
    """Refuse, once and before any row, a `response_schema` that a route sends in its
    provider's structured-output field and the provider cannot take: Anthropic's
    `output_config.format` (core/anthropic_schema.py; an older model asked through a forced
    tool has no such limits) and Gemini's `responseJsonSchema` (core/gemini_schema.py). It
    would fail line by line at the provider."""
    schema = spec.response_schema
    if ask_of(None, schema) is None:
        return
    for name, _, model in spec.sending_routes:
        if name in ANTHROPIC_ROUTES and spec.request_endpoint in (CHAT, MESSAGES) and anthropic_structured(model or spec.model):
            problem, field = schema_problem(sent_schema(schema)), "Anthropic's output_config.format"
        elif name in GEMINI_ROUTES and spec.request_endpoint in (CHAT, GEMINI):
            problem, field = gemini_schema.schema_problem(schema), "Gemini's responseJsonSchema"
        else:
            continue
        if problem is not None:
            raise SpecError(
                f"{where}: response_schema: {problem}. Route {name} asks for it as {field}, which would refuse every "
                "row; change the schema, or send the job to a route that takes it"
            )


def check_endpoint(route, name: str, endpoint: str, model: str, where: str) -> None:
    """Refuse a route that takes no request of `endpoint` at all (an Anthropic route and
    /v1/moderations), once and before the model or any row: its `refusal` of a bare body
    names the endpoint itself."""
    refusal = getattr(route, "refusal", None)
    refused = refusal(Request("", endpoint, {"model": model})) if refusal is not None else None
    if refused is not None and refused.field == "endpoint":
        raise SpecError(f"{where}: route {name} cannot send {endpoint} requests ({refused.reason}); "
                        "send the job to a route that takes them, or change `endpoint:`")  # fmt: skip


def check_job(spec: JobSpec, where: str = "job spec", after: Watermark | None = None) -> tuple[MessageTemplate, Source]:
    """Everything about a job that can be checked without reading its rows."""
    template = MessageTemplate.from_spec(spec, where)
    try:
        for route, options, model in spec.sending_routes:  # the route; its fallback, or its chain's tiers
            made = create_route(route, options)
            check_endpoint(made, route, spec.request_endpoint, model or spec.model, where)
            made.check_model(model or spec.model)
    except UnknownRouteError:
        raise
    except RouteError as err:  # a wrong model or option is a problem with the spec
        raise SpecError(f"{where}: {err}") from None
    check_prices(spec, where)
    check_model(spec, where)
    check_ask(spec, where)
    check_notify(spec, where)
    return template, open_source(spec, template, after)


def open_source(spec: JobSpec, template: MessageTemplate, after: Watermark | None = None) -> Source:
    """The job's source, its columns checked against what the spec uses (where the format
    says its columns before the rows: CSV, Parquet, SQL); `after`: rows past a watermark."""
    source = source_of(spec, after)
    if source.columns is not None:
        if spec.source.id_column not in source.columns:
            raise SourceError(
                f'{source.label}: no column "{spec.source.id_column}" (source.id_column); '
                f"columns are: {', '.join(source.columns)}"
            )
        template.check_columns(source.columns, source.name)
        for key, column in spec.param_columns.items():
            if column not in source.columns:
                raise SourceError(
                    f'{source.label}: param_columns.{key} names column "{column}", which it does not have; '
                    f"columns are: {', '.join(source.columns)}"
                )
    return source


def load_job(
    store: Store,
    spec: JobSpec,
    clock: Clock,
    where: str = "job spec",
    on_rows: Callable[[int], None] | None = None,
    requeue_changed: bool = False,
    routes_checked: bool = False,
) -> LoadReport:
    """Validate, render and persist every row of the job's source; see the module doc."""
    choice = None
    if spec.route == AUTO:  # decided before anything is stored (engine/auto.py)
        from lowtide.engine.auto import resolve

        spec, choice = resolve(store, spec, clock, where)
    try:
        return _load(store, spec, choice, clock, where, on_rows, requeue_changed, routes_checked)
    except _Versions as versions:  # an increment holds ids in several rows: again, each id's newest row only
        return _load(store, spec, choice, clock, where, on_rows, requeue_changed, routes_checked, versions.newest)


class _Versions(Exception):
    """Raised inside a load's transaction (so rolling it back) when an increment source holds
    an id in several rows: those rows are versions, and only the newest is to be loaded."""

    def __init__(self, newest: Newest):
        self.newest = newest


def _load(
    store: Store,
    spec: JobSpec,
    choice: Choice | None,
    clock: Clock,
    where: str,
    on_rows: Callable[[int], None] | None,
    requeue_changed: bool,
    routes_checked: bool,
    newest: Newest | None = None,
) -> LoadReport:
    after = stored_watermark(store, spec)
    # A changed row to re-run may be at or below the watermark: asked to, a load reads the
    # whole source (the watermark still never moves back).
    read_after = None if requeue_changed else after
    template, source = check_job(spec, where, read_after)
    render = RowRenderer(spec, template, source, routes_checked)
    now = clock.now()
    with store.begin() as conn:
        stored_spec = _stored_spec(conn, spec.name)
        changes = spec_changes(stored_spec, spec) if stored_spec is not None else SpecChanges()
        if changes.moves:
            move_connections(conn, spec.name, changes.moves, now, where)
        if changes.altering:
            _check_spec_change(conn, spec, changes, where, requeue_changed)
        job_id, created = save_job(conn, spec.name, spec.model_dump_json(), spec.route, now)
        if changes.sending:  # a batch given up as lost on a route the job left: nothing polls it now
            kept = {lane.route for lane in JobContext(job_id, spec.name, JobState.ACTIVE, spec).lanes}
            end_watches(conn, job_id, dispatches.c.route.not_in(kept), "the load took the job off its route", now)
        if choice is not None:
            add_event(conn, job_id, "route_choice", choice.reason, now)
        budget.resume(conn, job_id, spec.budget_usd, now)  # a budget_exhausted job, submitted again
        before = _count(conn, job_id)
        if render.body_column is None:  # (a row's own body is stored whole: no head to keep)
            render.head_id = payload_head(conn, job_id, render.prefix)
        insert_requests = _insert_requests(conn, job_id)
        ids = IdWatch()
        problems: list[str] = []
        refused: dict[str, list[int]] = {}  # refusal -> the rows it refuses
        changed = Changes()
        total = 0
        for chunk in source.chunks(strict=False):  # structural problems join the others, below
            if newest is not None:  # an older version of a row of an increment: the newest stands
                chunk = [r for r in chunk if not newest.older(row_id(r.values, spec.source.id_column, spec.variant), r.values)]
            good = []
            for row in chunk:
                item = render(row)
                if isinstance(item, str):
                    problems.append(item)
                elif isinstance(item, Refused):
                    refused.setdefault(item.message, []).append(item.row)
                else:
                    good.append(item)
            total += len(chunk)
            for g in good:  # ids are watched even after a problem: duplicates are reported with the rest
                ids.add(g["custom_id"])
            if good and not created:  # a new job has nothing stored to compare with
                good, known, stored = split_known(conn, job_id, good, spec.variant)
                note_changed(changed, stored, known, requeue_changed, _row_name(source), render.prefix)
            if good and not problems and not refused and not source.problems:
                executemany(conn, insert_requests, good)
            if on_rows:
                on_rows(total)
            if len(problems) >= MAX_PROBLEMS:
                break
        problems[:0] = source.problems
        if ids.has_repeats():
            repeats = repeated_rows(source, spec.source.id_column, ids, spec.variant)
            if spec.source.since is not None and newest is None:
                versions = Newest.of(repeats, spec.source.since.column)
                if not versions.ties:
                    raise _Versions(versions)
                repeats = versions.ties  # rows of one id and one `since` value: duplicates
            problems.extend(_duplicates(source, spec.source.id_column, repeats))
        problems.extend(_refused(source, refused))
        if problems:
            raise SourceError.from_problems(f"{source.label}: refused, nothing was stored", problems)
        increment = spec.source.since is not None and read_after is not None
        if total == 0 and increment:
            check_forward(source, after)
        elif total == 0:
            raise SourceError(
                f"source {source.label} has no rows; nothing was stored. Fill the file, or point source.path at the right one"
            )
        mark = save_watermark(conn, job_id, spec, source, after, now)
        requeued = requeue(conn, job_id, changed.pairs, now, where) if changed.pairs else 0
        new = _count(conn, job_id) - before
        if new or requeued:
            conn.execute(jobs.update().where(jobs.c.id == job_id).values(updated_at=now))
            move_job(conn, job_id, JobState.ACTIVE, finished_at=None)
        if new:
            past = f" past {spec.source.since.column} {after.shown()}" if increment else ""
            add_event(conn, job_id, "loaded", f"{new} new request(s) from {source.name} ({total} rows{past})", now)
        render.carried.note(conn, job_id, now)
        if changes.applied or changes.altering:
            add_event(conn, job_id, "spec_changed", "; ".join(changes.altering + changes.applied)[:2000], now)
        if changed.count:
            what = f"re-queued {requeued}" if requeued else "kept"
            examples = ", ".join(changed.examples)
            add_event(conn, job_id, "rows_changed", f"{changed.count} row(s) changed since stored ({examples}): {what}", now)
    store.added_pending(new + requeued)  # the planner must know they are there (Store.refresh_statistics)
    return LoadReport(
        job_id=job_id, created=created, rows=total, new=new, changed=changed.count, requeued=requeued,
        applied=changes.applied + (changes.altering if requeue_changed else []), watermark=mark.shown() if mark else None,
    )  # fmt: skip


# The columns a rendered row gives (`RowRenderer.__call__`); the rest of a new request's are
# the same in every row, written into the INSERT (`_insert_requests`).
RENDERED_COLUMNS = ("custom_id", "source_key", "source_row", "payload", "head_id", "model", "fingerprint")


def _insert_requests(conn: Connection, job_id: int) -> Insert:
    """The INSERT of a job's new requests, pending. What every row shares (the job, the state,
    no attempts yet) is written into the SQL once rather than bound in each row; the model,
    which comes from the spec, stays a bound parameter."""
    insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(requests)
    shared = {"job_id": job_id, "state": RequestState.PENDING.value, "attempts": 0, "not_before": 0.0}
    insert = insert.values(**{c: fixed(conn, v) for c, v in shared.items()}, **{c: bindparam(c) for c in RENDERED_COLUMNS})
    return insert.on_conflict_do_nothing(index_elements=["job_id", "custom_id"])


def _refused(source: Source, refused: dict[str, list[int]]) -> list[str]:
    """One problem per refusal, naming its rows: a spec-wide refusal is said once, not per row."""
    out = []
    for message, rows in refused.items():
        named = ", ".join(map(str, rows[:ROWS_NAMED])) + (f" and {len(rows) - ROWS_NAMED} more" if len(rows) > ROWS_NAMED else "")
        out.append(f"{source.name} row{'s' if len(rows) > 1 else ''} {named}: {message}")
    return out


def _row_name(source: Source) -> Callable[[int], str]:
    return lambda number: f"{source.name} row {number}"


def _stored_spec(conn: Connection, name: str) -> JobSpec | None:
    spec_json = conn.execute(select(jobs.c.spec).where(jobs.c.name == name)).scalar()
    return None if spec_json is None else stored_spec(spec_json)


def _check_spec_change(conn: Connection, spec: JobSpec, changes: SpecChanges, where: str, requeue_changed: bool) -> None:
    """Refuse a spec change that alters requests, naming the fix; with `requeue_changed`,
    refuse only a change of route or lane while batches are in flight on them (they would
    be left unpolled, or their answers priced as another model's), and a new id column."""
    first = (changes.rendering or changes.sending)[0]
    key, _, values = first.partition(" ")
    was, _, now = values.partition(" → ")
    if key == "source.id_column":  # other ids name other requests: no version of the stored ones
        raise SpecError(
            f'{where}: job "{spec.name}" was stored with ids from column "{was}"; this spec takes them from "{now}". '
            "Ids name the requests: use a new job name"
        )
    if not requeue_changed:
        more = len(changes.altering) - 1
        also = f" (and {more} more change(s): {'; '.join(changes.altering[1:])})" if more else ""
        stored_as = f"{key} {was}; this spec says {now}" if key != "fallback" else f"{'a' if was == 'set' else 'no'} fallback; this spec has {'one' if now == 'set' else 'none'}"
        raise SpecError(
            f'{where}: job "{spec.name}" was stored with {stored_as}{also}. Use a new job name, or pass '
            "--requeue-changed to re-render and re-queue the requests it changes"
        )
    if changes.sending:
        job_id = conn.execute(select(jobs.c.id).where(jobs.c.name == spec.name)).scalar_one()
        live = conn.execute(
            select(dispatches.c.route).where(
                dispatches.c.job_id == job_id, dispatches.c.state.in_(LIVE_DISPATCH_STATES)
            ).limit(1)
        ).scalar()
        if live is not None:
            raise SpecError(
                f'{where}: job "{spec.name}" has batches in flight on {live}; a change of {key} now would '
                "leave them unfinished. Wait until they end (`lowtide status`), or use a new job name"
            )


def _count(conn: Connection, job_id: int) -> int:
    return conn.execute(select(func.count()).select_from(requests).where(requests.c.job_id == job_id)).scalar_one()


def _duplicates(source: Source, id_column: str, repeats: dict[str, list[SourceRow]]) -> list[str]:
    """One problem per repeated id, naming its rows."""
    return [
        f'{_places(source, rows)}: duplicate id "{cid}" in column "{id_column}"; '
        "ids must be unique (remove or renumber the repeats)"
        for cid, rows in sorted(repeats.items())
    ]


def _places(source: Source, rows: list[SourceRow]) -> str:
    """Where the rows are: `t.csv rows 1, 4` in one file; in a source of many files each
    row's file and line (`dt=2026-12-02/part.csv line 3, …`: a row's number counts the
    rows of every file read)."""
    if all(row.file is None for row in rows):
        return f'{source.name} rows {", ".join(str(row.number) for row in rows)}'
    return ", ".join(f"{row.file} line {row.line}" if row.file and row.line else row.where(source.name) for row in rows)
