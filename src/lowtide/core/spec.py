"""The job spec: one Pydantic model, loaded from YAML or built in Python.

Every path in a spec file is relative to the spec file's folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from lowtide.core.auto_spec import AUTO, AutoSpec, TierSpec, parse_duration
from lowtide.core.callbacks import (
    CallbackRefused,
    Callbacks,
    check_literal,
    check_url_form,
    shown_url,
)
from lowtide.core.cards import routes_of
from lowtide.core.embeddings import check_dimensions
from lowtide.core.endpoints import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    ENGINE_EXTRAS,
    GEMINI,
    MESSAGES,
    MODERATIONS,
    NEVER,
    NO_TEXT,
    conversation_key,
    known_keys,
    required_keys,
)
from lowtide.core.errors import SpecError
from lowtide.core.gemini import camel_body
from lowtide.core.ids import MAX_VARIANT, VARIANT_NAME, VARIANT_SEPARATOR
from lowtide.core.params import OUTPUT_LIMITS, carries, check_schema, check_values
from lowtide.core.yamlfile import parse_mapping, read_text, validate

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
JOB_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$")


def format_of(path: str | Path, declared: str | None = None) -> str:
    """The data format of `path`: declared, or from its extension."""
    if declared:
        return declared
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise SpecError(
            f'{path}: unknown file extension "{Path(path).suffix}"; '
            f"use one of {', '.join(sorted(FORMATS))} or set `format:` explicitly"
        )
    return fmt


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


FILTER_OPS = ("=", "==", "!=", "<", "<=", ">", ">=", "in", "not in")
SOURCE_KINDS = ("string", "int", "float", "bool", "date", "timestamp")


def sql_url(v: str | None) -> str | None:
    """An SQLAlchemy URL with no password in it, in either form (a spec never holds a key)."""
    if v is not None:
        from sqlalchemy.engine import make_url

        from lowtide.core.sql_urls import holds_password

        try:
            url = make_url(v)
        except Exception as err:
            raise ValueError(f"not an SQLAlchemy URL ({err}); e.g. postgresql://user@host/db") from None
        if holds_password(url):
            raise ValueError("holds a password; a spec never holds a key: remove it and give it the driver's own way "
                             "(PGPASSWORD or ~/.pgpass for PostgreSQL)")  # fmt: skip
    return v


class SinceSpec(_Strict):
    """Nightly increments (docs/data.md): read only rows whose `column` is past the highest
    value the last load of this job saw (its watermark, kept in the store)."""

    column: str


class SourceSpec(_Strict):
    """Where the rows come from (docs/data.md): `path` (a file, a folder or a glob; local,
    or a URL: s3://, gs://, az://, abfs://, hf://, https://), or `url` (an SQLAlchemy URL)
    with `table` or `query`."""

    path: str | None = None
    url: str | None = None
    table: str | None = None
    query: str | None = None
    id_column: str
    format: Literal["csv", "jsonl", "parquet"] | None = None
    # Columns the template may use that are allowed to be empty in some rows.
    optional_columns: list[str] = Field(default_factory=list)
    # Rows to read: [[column, op, value], ...], all of which must hold. Pushed down to a
    # Parquet dataset (partitions and row groups left unread) and to a SQL query.
    filter: list[tuple[str, str, Any]] = Field(default_factory=list)
    since: SinceSpec | None = None
    # Column types of CSV and JSONL sources in typed results (core/source_types.py).
    types: dict[str, Literal["string", "int", "float", "bool", "date", "timestamp"]] = Field(default_factory=dict)

    @field_validator("filter", mode="before")
    @classmethod
    def _filter(cls, v: Any) -> Any:
        if v is None:
            return []
        if isinstance(v, list):
            for i, item in enumerate(v):
                if not isinstance(item, list | tuple) or len(item) != 3 or not isinstance(item[0], str):
                    raise ValueError(f"item {i + 1}: give [column, op, value], e.g. [dt, \">=\", \"2026-12-01\"]")
                if item[1] not in FILTER_OPS:
                    raise ValueError(f"item {i + 1}: op {item[1]!r}; use one of {', '.join(FILTER_OPS)}")
                if item[1] in ("in", "not in") and not isinstance(item[2], list):
                    raise ValueError(f"item {i + 1}: `{item[1]}` takes a list of values, e.g. [lang, in, [en, fr]]")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return sql_url(v)

    @model_validator(mode="after")
    def _one_place(self) -> SourceSpec:
        if (self.path is None) == (self.url is None):
            raise ValueError("give exactly one of `path` (a file, a folder, a glob or a URL of files) or `url` (a SQL database) "
                             "with `table` or `query`")  # fmt: skip
        if self.url is not None:
            if (self.table is None) == (self.query is None):
                raise ValueError("a SQL source takes exactly one of `table` or `query`")
            if self.format is not None:
                raise ValueError("`format` is for files; a SQL source has none: remove it")
        elif self.table is not None or self.query is not None:
            raise ValueError("`table` and `query` are for a SQL source: give `url` instead of `path`")
        return self

    @property
    def where(self) -> str:
        """The source, named for messages."""
        if self.url is not None:
            from lowtide.core.sql_urls import shown_url

            shown = shown_url(self.url)
            return f"{shown} table {self.table}" if self.table else f"{shown} query"
        return self.path or ""


class PartSpec(_Strict):
    """One content part added to the user message from a column (docs/jobs.md "Images and files")."""

    column: str
    # Images on chat completions and responses: how closely the model looks (low, high, auto).
    detail: Literal["auto", "low", "high"] | None = None


class TemplateSpec(_Strict):
    system: str | None = None
    user: str | None = None
    system_file: str | None = None
    user_file: str | None = None
    # Rows that already are conversations: this column holds the messages in the endpoint's
    # own shape (a list, or its JSON text), checked against the SDK's types and kept verbatim
    # (core/conversations.py). Such rows may also carry max_tokens, temperature and stop.
    messages_column: str | None = None
    # Rows that already are request bodies (an API's batch lines, say): this column holds
    # the whole body of the job's endpoint, a JSON object (or its text). It is stored as it
    # is, with the job's model as its `model`: lowtide's one change, recorded as the
    # request's model.
    body_column: str | None = None
    # Content parts after the user template's text, in order: an image or a file (PDF) per
    # column, from a URL, a path (relative to the spec), base64 text or bytes in each cell.
    images: list[PartSpec] = Field(default_factory=list)
    files: list[PartSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_of_each(self) -> TemplateSpec:
        given = [k for k in ("user", "user_file", "messages_column", "body_column") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of `user` (inline), `user_file` (a path), `messages_column` (rows that are "
                "conversations) or `body_column` (rows that are request bodies)"
            )
        if self.body_column is not None and (self.system is not None or self.system_file is not None):
            raise ValueError("`body_column` rows are whole request bodies: give no `system` template")
        if self.system is not None and self.system_file is not None:
            raise ValueError("give at most one of `system` or `system_file`")
        if (self.images or self.files) and self.user is None and self.user_file is None:
            raise ValueError("`images` and `files` are added to the user message: give a `user` template (rows that are "
                             "conversations or bodies carry their parts in the cell)")
        if any(f.detail for f in self.files):
            raise ValueError("`detail` is for images; remove it from `files`")
        return self


def template_keys(endpoint: str) -> frozenset[str]:
    """Body keys a spec does not set through `params`: the model and the template make them."""
    return frozenset({"model", conversation_key(endpoint)} | ({"system"} if endpoint == MESSAGES else set()))
ANTHROPIC_ROUTES = routes_of("anthropic")  # core/cards.py: anthropic, anthropic-batch


def default_endpoint(route: str) -> str:
    """The endpoint a job's requests are for when its spec does not say."""
    return MESSAGES if route in ANTHROPIC_ROUTES else CHAT


# Set while a spec is rebuilt from lowtide's own store (`rebuilt_from_store`): its params
# passed check_params, against the installed SDK's types, when the spec was stored. Reading
# those types again imports the openai package (0.5-1 s of CPU) for commands that send
# nothing, such as `lowtide compare`; the key and value checks that need them are skipped.
_REBUILT = ContextVar("lowtide_spec_rebuilt_from_store", default=False)


@contextmanager
def rebuilt_from_store() -> Iterator[None]:
    """Specs built inside this block come from the store, checked when they were stored."""
    token = _REBUILT.set(True)
    try:
        yield
    finally:
        _REBUILT.reset(token)


def check_params(
    params: dict[str, Any],
    endpoint: str,
    per_row: frozenset[str] = frozenset(),
    route: str | None = None,
    stored: bool = False,
) -> dict[str, Any]:
    """`params` as the body keys of `endpoint` they are (a null value sets nothing), or a
    ValueError naming the key and the keys the endpoint has, or what is wrong with a value
    (core/params.py). `per_row` keys are filled from each row (`param_columns`). On a
    `route` that sends the body to its own protocol's provider unchanged (params.carries), a
    key the installed SDK does not declare is carried, not refused; a Gemini key's
    snake_case name is read as its camelCase one (core/gemini.py). `stored` params passed all
    of this when their spec was stored: what reads the SDK's types is not done again."""
    if endpoint == GEMINI:
        named = camel_body(params)
        if isinstance(named, tuple):
            raise ValueError(f'"{named[0]}" {named[1]}')
        params = named
    if not params:  # nothing to check (and the SDK's types, which the check reads, stay unimported)
        return {}
    if stored:
        return {k: v for k, v in params.items() if v is not None}
    known = known_keys(endpoint) | ENGINE_EXTRAS
    made = template_keys(endpoint)
    for key in params:
        if key in made:
            raise ValueError(f'"{key}" is set by the job\'s model and template, not by params')
        if key in NEVER:
            raise ValueError(f'"{key}": a batch or stored request cannot be streamed; remove it')
        if key not in known and not carries(route, endpoint):
            others = sorted(known_keys(endpoint) - made - NEVER)
            said = f'its parameters are: {", ".join(others)}' if others else "it takes none beyond the model and template"
            raise ValueError(f'"{key}" is not a parameter of {endpoint}; {said}')
    params = {k: v for k, v in params.items() if v is not None}
    check_values(params, endpoint, per_row)
    return params


def model_name(v: str | None) -> str | None:
    """A model name as the provider will read it: never empty, no stray spaces (a provider
    fails every request of a model it does not have, and `""` is none)."""
    if v is not None and not v.strip():
        raise ValueError("is empty; give the model's name, e.g. gpt-4o-mini")
    if v is not None and v != v.strip():
        raise ValueError(f"{v!r} has spaces around it; write {v.strip()!r}")
    return v


class RetrySpec(_Strict):
    max_attempts: int = Field(3, ge=1, le=100)
    backoff_seconds: float = Field(30.0, ge=0)
    max_backoff_seconds: float = Field(3600.0, ge=0)


class FallbackSpec(_Strict):
    """Where requests go when the job's route cannot finish them: after it failed them
    retryably more often than `retry` allows, when they expired, or when the deadline is
    too close for the route (docs/fallback.md)."""

    route: str
    route_options: dict[str, Any] = Field(default_factory=dict)
    # The model on the fallback route; default: the job's model.
    model: str | None = None

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        return model_name(v)
    # Seconds before the deadline at which in-flight batches are cancelled and what they
    # have not finished goes to the fallback route.
    safety_margin: float = Field(900.0, gt=0)
    # Seconds a batch of the job's route is expected to take, until this store has seen
    # enough of that route's batches to know better.
    expected_turnaround: float = Field(3600.0, gt=0)


class RetentionSpec(_Strict):
    """How long `lowtide prune` (run without --older-than) keeps a finished job's bodies,
    counted from when the job ended (docs/jobs.md "Retention"): `payloads` the payloads sent
    and the providers' raw responses, `results` the answers as well. Durations: 30d, 12h, 90m."""

    payloads: str | None = None
    results: str | None = None

    @field_validator("payloads", "results", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        if v is None:
            return v
        text = str(v).strip() if isinstance(v, str | int | float) and not isinstance(v, bool) else None
        try:
            parse_duration(text if text is not None else v)
        except ValueError:
            raise ValueError(f"{v!r} is not a duration above 0; write e.g. 30d, 12h or 90m (a number and s, m, h or d)") from None
        return text

    @model_validator(mode="after")
    def _order(self) -> RetentionSpec:
        if self.payloads is None and self.results is None:
            raise ValueError("give `payloads`, `results` or both (e.g. `retention: {payloads: 30d, results: 90d}`), or leave `retention` out")
        if self.payloads_s is not None and self.results_s is not None and self.results_s < self.payloads_s:
            raise ValueError(
                f"results ({self.results}) is shorter than payloads ({self.payloads}): answers are dropped together with the "
                "payloads, so keep results at least as long; raise `results` or lower `payloads`"
            )
        return self

    @property
    def payloads_s(self) -> float | None:
        return None if self.payloads is None else parse_duration(self.payloads)

    @property
    def results_s(self) -> float | None:
        return None if self.results is None else parse_duration(self.results)


NOTIFY_EVENTS = ("finished", "failed", "budget_exhausted", "deadline_cutover")
_VARIABLE = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")


class NotifySpec(_Strict):
    """Where a job's notifications go (docs/notifications.md): each URL is POSTed a signed
    JSON document when one of `events` happens, at least once, with a delivery id. URLs
    follow the gateway's callback rules (core/callbacks.py): loopback, private and
    link-local addresses are refused unless allowed here."""

    # Before `urls`: the URLs are judged by them.
    allow_loopback: bool = False  # 127/8, ::1
    allow_private: bool = False  # 10/8, 172.16/12, 192.168/16, fc00::/7, 100.64/10, …
    allow_link_local: bool = False  # 169.254/16 (cloud metadata), fe80::/10
    urls: list[str] = Field(min_length=1, max_length=10)
    events: list[Literal["finished", "failed", "budget_exhausted", "deadline_cutover"]] = Field(
        default_factory=lambda: list(NOTIFY_EVENTS), min_length=1
    )
    # The environment variable that holds the signing secret (never the secret itself).
    secret_env: str = "LOWTIDE_WEBHOOK_SECRET"
    max_attempts: int = Field(8, ge=1, le=100)  # then the delivery is given up, with an event
    backoff_seconds: float = Field(2.0, ge=0)  # before the 2nd attempt; doubled each time, ±20 %
    max_backoff_seconds: float = Field(600.0, ge=0)
    timeout_seconds: float = Field(10.0, gt=0, le=300)  # one deadline per attempt

    @field_validator("urls", mode="before")
    @classmethod
    def _url_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError(f"give a list of URLs, e.g. urls: [{v}]")
        return v

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: list[str], info: ValidationInfo) -> list[str]:
        """Each URL's form, and a literal address's range, now; a host name's addresses when
        the job is checked (engine/notify.py `check_notify`) and again before each attempt."""
        if len(set(v)) != len(v):
            raise ValueError("a URL is given twice; give each receiver once")
        rules = _rules(info.data)
        for i, url in enumerate(v):
            try:
                host, _ = check_url_form(url, rules)
                check_literal(host, rules)
            except CallbackRefused as err:
                raise ValueError(f"URL {i + 1} ({shown_url(url)}): {str(err).removeprefix('callback URL: ')}"
                                 f"{_allow_hint(str(err))}") from None  # fmt: skip
        return v

    @field_validator("events")
    @classmethod
    def _events(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @field_validator("secret_env")
    @classmethod
    def _secret_env(cls, v: str) -> str:
        if not _VARIABLE.fullmatch(v):  # most likely the secret itself, pasted in: never repeated
            raise ValueError("must name an environment variable (capitals, digits, _), not hold the secret itself; "
                             "the value is not repeated here")  # fmt: skip
        return v

    @property
    def rules(self) -> Callbacks:
        return _rules(self.__dict__)


def _rules(fields: dict[str, Any]) -> Callbacks:
    return Callbacks(**{k: bool(fields.get(k)) for k in ("allow_loopback", "allow_private", "allow_link_local")})


def _allow_hint(problem: str) -> str:
    for what, key in (("loopback", "allow_loopback"), ("private", "allow_private"), ("link-local", "allow_link_local")):
        if f"a {what} address" in problem:
            return f"; point it at a public receiver, or set notify.{key}: true if that receiver is yours"
    return ""


class OutputSpec(_Strict):
    """Where results go (docs/data.md): `path` (a file, or with `partition_by` a folder;
    local or an object-store URL), or `url` (an SQLAlchemy URL) with `table`."""

    path: str | None = None
    format: Literal["csv", "jsonl", "parquet"] | None = None
    # Columns whose values name the folders of a partitioned results dataset (col=value/).
    partition_by: list[str] = Field(default_factory=list)
    url: str | None = None
    table: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return sql_url(v)

    @model_validator(mode="after")
    def _one_place(self) -> OutputSpec:
        if (self.path is None) == (self.url is None):
            raise ValueError("give exactly one of `path` (a file or, with partition_by, a folder) or `url` with `table` (a SQL table)")
        if self.url is not None and (self.table is None or self.format is not None or self.partition_by):
            raise ValueError("a SQL output takes `url` and `table` only")
        if self.path is not None and self.table is not None:
            raise ValueError("`table` is for a SQL output: give `url` instead of `path`")
        return self


class JobSpec(_Strict):
    name: str
    source: SourceSpec
    template: TemplateSpec
    model: str
    route: str
    route_options: dict[str, Any] = Field(default_factory=dict)
    # The endpoint the requests are for, and so the shape of their bodies (docs/jobs.md
    # "Endpoints"); default: /v1/messages on Anthropic's routes, else /v1/chat/completions.
    endpoint: Literal["/v1/chat/completions", "/v1/responses", "/v1/completions", "/v1/messages", "/v1beta/models:generateContent",
                      "/v1/embeddings", "/v1/moderations"] | None = None
    # Embedding jobs (docs/embeddings.md): several rows' inputs share one provider request
    # within the endpoint's limits (`packing: false` sends one row per request); an input
    # over the model's token limit is refused, or cut to it with `truncate: true`.
    packing: bool = True
    truncate: bool = False
    # Body parameters taken from each row: {parameter: column}. A row's empty cell leaves the
    # parameter at its `params` value (or unset); CSV text is read as the SDK's type says.
    param_columns: dict[str, str] = Field(default_factory=dict)
    # Body parameters of that endpoint, sent as they are: nothing is set that is not here.
    params: dict[str, Any] = Field(default_factory=dict)
    choices: list[str] | None = None
    response_schema: dict[str, Any] | None = None
    # An answer that fails `choices` or `response_schema` is asked again once, with the
    # validation error in the conversation (a repair attempt, its cost reported apart:
    # docs/costs.md); `repair: false` fails the request at once with the error instead.
    repair: bool = True
    deadline: datetime | None = None
    retry: RetrySpec = Field(default_factory=RetrySpec)
    fallback: FallbackSpec | None = None
    # `route: auto`: candidate routes and how long the work may wait (core/auto_spec.py).
    auto: AutoSpec | None = None
    output: OutputSpec | None = None
    # How long `lowtide prune` keeps the job's payloads and results once it has ended.
    retention: RetentionSpec | None = None
    # Requests per provider batch, below the route's own limit (batch routes only).
    chunk_size: int | None = Field(None, ge=1)
    # USD the job may spend in all (docs/costs.md "Budgets"): each batch or direct dispatch
    # reserves its estimated cost first, and the job stops sending (`budget_exhausted`)
    # rather than go over.
    budget_usd: Decimal | None = Field(None, gt=0, allow_inf_nan=False)
    # Signed POSTs when the job finishes, fails, runs out of budget or is cut over at its
    # deadline (docs/notifications.md).
    notify: NotifySpec | None = None
    # Labels `lowtide report --by tag` groups costs by.
    tags: list[str] = Field(default_factory=list)
    # The eval variant this job runs (core/evals.py): its name ends every custom_id.
    variant: str | None = None
    # Folder that relative paths are resolved against (the spec file's folder).
    base_dir: str = "."

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not JOB_NAME.match(v):
            raise ValueError("use 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit")
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        return model_name(v)

    @field_validator("endpoint", mode="before")
    @classmethod
    def _endpoint_word(cls, v: Any) -> Any:
        return {"embeddings": EMBEDDINGS, "moderations": MODERATIONS}.get(v, v) if isinstance(v, str) else v  # the docs' short words

    @field_validator("notify", mode="before")
    @classmethod
    def _notify_mapping(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, dict | NotifySpec):
            raise ValueError("give a mapping, e.g. notify: {urls: [https://hooks.example.com/lowtide], "
                             "secret_env: LOWTIDE_WEBHOOK_SECRET} (docs/notifications.md)")  # fmt: skip
        return v

    @field_validator("choices")
    @classmethod
    def _choices(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (len(v) < 2 or len(set(v)) != len(v) or not all(c.strip() for c in v)):
            raise ValueError("give at least two distinct, non-empty choices")
        return v

    @field_validator("variant")
    @classmethod
    def _variant(cls, v: str | None) -> str | None:
        if v is not None and (not VARIANT_NAME.match(v) or VARIANT_SEPARATOR in v):
            raise ValueError(f"variant {v!r}: use 1-{MAX_VARIANT} letters, digits, '-' or single '_' (it is part of every custom_id)")
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: list[str]) -> list[str]:
        bad = [t for t in v if not JOB_NAME.match(t)]
        if bad:
            raise ValueError(f"tag {bad[0]!r}: use 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit")
        return list(dict.fromkeys(v))

    @field_validator("response_schema")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            try:
                check_schema(v)
            except ValueError as err:
                raise ValueError(f"not a valid JSON Schema: {err}") from None
        return v

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: datetime | None) -> datetime | None:
        # A time without an offset is read differently on every machine: never guessed.
        if v is not None and v.utcoffset() is None:
            raise ValueError(
                f"{v.isoformat()} has no UTC offset; add `Z` for UTC (e.g. {v.replace(tzinfo=UTC).isoformat().replace('+00:00', 'Z')}) "
                "or an offset such as +02:00"
            )
        return v

    @field_validator("params")
    @classmethod
    def _params(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        route = info.data.get("route")
        if route is None:  # the route is refused already: its error is the one to read
            return v
        endpoint = info.data.get("endpoint") or default_endpoint(route)
        return check_params(v, endpoint, frozenset(info.data.get("param_columns") or ()), route, stored=_REBUILT.get())

    @field_validator("param_columns")
    @classmethod
    def _param_columns(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        route = info.data.get("route")
        if route is not None:  # the names only: the values come with each row
            check_params(dict.fromkeys(v), info.data.get("endpoint") or default_endpoint(route), route=route, stored=_REBUILT.get())
        return v

    @model_validator(mode="after")
    def _parts_endpoint(self) -> JobSpec:
        if self.param_columns and self.template.body_column is not None:
            raise ValueError("`body_column` rows are whole request bodies: put their parameters in the body, not in param_columns")
        if (self.template.images or self.template.files) and self.request_endpoint == COMPLETIONS:
            raise ValueError(f"{COMPLETIONS} takes a text prompt: images and files need /v1/chat/completions, /v1/responses or /v1/messages (`endpoint:`)")
        if self.request_endpoint == GEMINI and self.template.body_column is None:
            # Templates render chat turns; the Gemini routes translate those (docs/gemini.md).
            raise ValueError(f"endpoint {GEMINI} takes whole bodies: set template.body_column, or leave endpoint out "
                             "(the job's chat requests are translated by the gemini routes, docs/gemini.md)")
        return self

    @model_validator(mode="after")
    def _embedding_job(self) -> JobSpec:
        """An embedding job's rows give text to embed: a `user` template (or whole bodies)."""
        if self.request_endpoint != EMBEDDINGS:
            if self.truncate:
                raise ValueError("`truncate` is for embedding jobs (endpoint: embeddings)")
            return self
        t = self.template
        if t.messages_column is not None or t.system is not None or t.system_file is not None or t.images or t.files:
            raise ValueError("an embedding job's template is `user` (or `user_file`): the text to embed; "
                             "it has no system prompt, conversation, images or files")
        if self.choices or self.response_schema:
            raise ValueError("`choices` and `response_schema` check answers; an embedding has none: remove them")
        problem = check_dimensions(self.model, self.params.get("dimensions"))
        if problem:
            raise ValueError(problem)
        # Keys of text generation, carried by OpenAI's routes as unknown keys, would only be
        # refused by the provider, every request of the job failing (an estimate's advice once
        # named max_tokens).
        for key in ("messages", "prompt", *OUTPUT_LIMITS):
            if key in self.params or key in self.param_columns:
                raise ValueError(f'"{key}" is not a parameter of {EMBEDDINGS} (it takes `input`, made by the template, '
                                 "`model`, `dimensions` and `encoding_format`): remove it")
        return self

    @model_validator(mode="after")
    def _moderation_job(self) -> JobSpec:
        """A moderation job's rows give text to classify; its answer is a verdict, not text."""
        if self.request_endpoint != MODERATIONS:
            return self
        t = self.template
        if t.messages_column is not None or t.system is not None or t.system_file is not None or t.images or t.files:
            raise ValueError(f"a {MODERATIONS} job's template is `user` (or `user_file`): the text to classify, sent as `input`; "
                             "it has no system prompt, messages, images or files (or give whole bodies with `body_column`)")
        if self.choices or self.response_schema:
            raise ValueError(f"`choices` and `response_schema` check a model's text; a {MODERATIONS} answer is a verdict "
                             "(flagged, categories, scores): remove them")
        # Keys of text generation, carried by OpenAI's routes as unknown keys, would only be refused there.
        for key in ("messages", "prompt", *OUTPUT_LIMITS):
            if key in self.params or key in self.param_columns:
                raise ValueError(f'"{key}" is not a parameter of {MODERATIONS} (it takes `input`, made by the template, '
                                 "and `model`): remove it")
        return self

    @model_validator(mode="after")
    def _required_params(self) -> JobSpec:
        """A key the endpoint requires that neither the model nor the template makes (Anthropic's
        max_tokens) must be in params, unless the rows bring their own."""
        if self.template.messages_column is None and self.template.body_column is None:
            endpoint = self.request_endpoint
            missing = sorted(required_keys(endpoint) - template_keys(endpoint) - set(self.params) - set(self.param_columns))
            if missing:
                raise ValueError(f"params.{missing[0]} is required by {endpoint}; set it (e.g. params: {{{missing[0]}: 1024}})")
        return self

    @model_validator(mode="after")
    def _bounded_budget(self) -> JobSpec:
        # Rows that bring their own limit (a conversation, a whole body, a `param_columns` limit)
        # are estimated at it, each (engine/budget.py); one that brings none stops the budget there.
        rows_limit = (self.template.messages_column is not None or self.template.body_column is not None
                      or any(key in self.param_columns for key in OUTPUT_LIMITS))  # fmt: skip
        if (self.budget_usd is not None and self.output_limit is None and not rows_limit
                and self.request_endpoint not in NO_TEXT):  # an embedding or a moderation has no output tokens
            raise ValueError(
                "budget_usd needs an output limit to estimate against: set params.max_tokens "
                "(or max_completion_tokens / max_output_tokens), or give each row its own (param_columns); "
                "without one an answer's cost has no bound"
            )
        return self

    @model_validator(mode="after")
    def _auto(self) -> JobSpec:
        decided = self.auto is not None and self.auto.chosen == self.route  # lowtide's own record of its choice
        if (self.route == AUTO) != (self.auto is not None) and not decided:
            raise ValueError("`route: auto` and an `auto:` section (max_wait, candidates) go together; give both or neither")
        if self.auto is not None and self.auto.max_wait == "deadline" and self.deadline is None:
            raise ValueError("`auto.max_wait: deadline` needs a `deadline:`; set one, or give max_wait as a duration such as 2h")
        return self

    @model_validator(mode="after")
    def _chain(self) -> JobSpec:
        chain = self.auto.chain if self.auto is not None else None
        if chain and (self.fallback is not None or (chain[0].route, chain[0].route_options) != (self.route, self.route_options)):
            raise ValueError("`auto.chain` is lowtide's record of a decided `route: auto`; remove it (with `chosen`) to decide again")
        return self

    @model_validator(mode="after")
    def _fallback_elsewhere(self) -> JobSpec:
        if self.fallback is not None and self.fallback.route == self.route:
            raise ValueError(f"`fallback.route` must differ from `route` ({self.route}); retries on the same route are `retry:`")
        return self

    @property
    def request_endpoint(self) -> str:
        return self.endpoint or default_endpoint(self.route)

    @property
    def output_limit(self) -> int | None:
        """The output token limit `params` sets, under the endpoint's name for it, or None."""
        for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            if isinstance(self.params.get(key), int):
                return self.params[key]
        return None

    @property
    def output_bound(self) -> int | None:
        """The most output tokens each request may be billed where `params` alone decide
        it: the output limit times the answers `n` asks for. None where the rows decide it
        (a messages or body column, param_columns giving a limit or n) or params set no limit."""
        rows_decide = (self.template.messages_column is not None or self.template.body_column is not None
                       or not self.param_columns.keys().isdisjoint((*OUTPUT_LIMITS, "n")))  # fmt: skip
        if rows_decide or self.output_limit is None:
            return None
        n = self.params.get("n")
        return self.output_limit * (n if type(n) is int and n > 1 else 1)

    @property
    def chain(self) -> list[TierSpec] | None:
        """The tiers of a decided `route: auto` job (engine/tiers.py), when it has more than one."""
        chain = self.auto.chain if self.auto is not None else None
        return chain if chain and len(chain) > 1 else None

    @property
    def sending_routes(self) -> list[tuple[str, dict[str, Any], str | None]]:
        """Every route the job's requests may run on, as (route, route options, the model it
        sends instead of the job's, if any): its route and its fallback's, or its chain's tiers."""
        if self.chain:
            return [(t.route, t.route_options, None) for t in self.chain]
        out: list[tuple[str, dict[str, Any], str | None]] = [(self.route, self.route_options, None)]
        if self.fallback is not None:
            out.append((self.fallback.route, self.fallback.route_options, self.fallback.model))
        return out

    @property
    def fallback_model(self) -> str:
        return (self.fallback and self.fallback.model) or self.model

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else Path(self.base_dir) / p

    @property
    def effective_choices(self) -> list[str] | None:
        """`choices`, or the top-level `enum` of the response schema."""
        if self.choices:
            return self.choices
        enum = (self.response_schema or {}).get("enum")
        return [str(e) for e in enum] if enum else None


def load_spec(path: str | Path) -> JobSpec:
    """Read a job spec file; every problem names the file, line and key, and the fix."""
    path = Path(path)
    text = read_text(path, "job spec")
    data, lines = parse_mapping(text, str(path), "a job spec is a YAML mapping with keys name, source, template, model, route")
    if "variants" in data:  # (core/evals.py is_eval_data) refused as a job spec by its missing `model`: say what it is
        raise SpecError(f"{path}: an eval spec (it has `variants:`, docs/evals.md), not a job spec; run it with "
                        f"`lowtide run {path}`, which runs every variant (in Python: lowtide.Eval.from_yaml)")  # fmt: skip
    data.setdefault("base_dir", str(path.parent.resolve()))
    return build_spec(data, where=str(path), lines=lines)


def build_spec(data: dict[str, Any], where: str = "job spec", lines: dict | None = None) -> JobSpec:
    return validate(JobSpec, data, where, "job spec", lines)


def stored_spec(spec_json: str | bytes) -> JobSpec:
    """A job's spec as the store keeps it (`jobs.spec`). It passed every check when it was
    stored; the ones that read the SDK's types are not run again (`rebuilt_from_store`),
    so a command that reads a job, such as `lowtide status`, does not import the openai
    package (0.7 s of CPU) for it."""
    with rebuilt_from_store():
        return JobSpec.model_validate_json(spec_json)


# The change classification lives in its own module; imported here for its older callers.
from lowtide.core.spec_changes import SpecChanges, spec_changes  # noqa: E402, F401
