"""Results joined to the source rows by custom_id (never by position), streamed chunk by chunk.

Each output row is the source row plus: custom_id, state, output, one column per property of
an object response schema (or `parsed` for any other schema), error, tokens, attempts, route,
source_changed, then what the provider's stored answer says (answer_columns.py):
finish_reason, tool_calls, refusal, reasoning, logprobs, choices (all of them, where n > 1),
and with `full` the whole response. A schema property named like one of those columns
(`state`, `route`, `response`, ...) is written as `answer_<name>` beside lowtide's own, in
every format and sink alike; a lowtide column whose name the source already uses is prefixed
with `lowtide_`. No column is ever written over by another.

Nested values are real nested values: objects in JSONL, structs and lists in Parquet (types
in answer_columns.py), JSON text in CSV. Rows are read a source chunk at a time, and a
chunk's stored answers in pages of at most PAGE_BYTES, so a job of huge answers (logprobs of
long outputs) is exported in bounded memory. A chunk's stored requests are found by custom_id;
as a load stores them in source order, the job's next requests in id order (as many as the
chunk has rows) are read first, by a range of the primary key, and only the ids not among
them are looked up one by one: once two such windows in a row were mostly not the chunk's
(a source in another order), the rest of the pass looks every id up.

`source_changed` is true where the row, rendered now, is not what the stored request was
rendered from (its text, the template or the spec changed since): the answer beside it is
for the row as it was, and is never passed off as an answer to the row as it is. An increment
source (`source.since`) that holds an id in several rows writes the request once, beside its
newest row (versions.py).

A succeeded request whose answer `lowtide prune` dropped (its text, parsed answer and the
provider's response all gone) has state `pruned` (PRUNED_STATE) and empty answer columns:
never a `succeeded` row with a null answer, which a reader (or a SQL table's upsert) would
take for the answer. A SQL table keeps its own copy of such a row (sql_sink.py). After
`prune --keep-results` a row is as it was, but for `full`'s `response`: the answer columns
are read from the record the prune kept in place of the response (kept_answers.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import ne
from pathlib import Path
from typing import Any

from sqlalchemy import Integer, Row, Select, and_, bindparam, case, or_, select, type_coerce

from lowtide.core import fastjson
from lowtide.core.errors import LowtideError
from lowtide.core.ids import custom_id_of, key_of, legacy_custom_ids
from lowtide.core.locations import location
from lowtide.core.output_target import OutputTarget
from lowtide.core.sources import source_of
from lowtide.core.spec import JobSpec, format_of, stored_spec
from lowtide.core.states import RequestState
from lowtide.core.templates import MessageTemplate
from lowtide.engine.answer_columns import ANSWER_COLUMNS, answer_values, plain_values
from lowtide.engine.committed import committed
from lowtide.engine.loader import RowRenderer
from lowtide.engine.result_writers import WRITERS, tally
from lowtide.engine.retention import PRUNED
from lowtide.engine.versions import IdWatch, Newest, repeated_rows, row_id
from lowtide.store.bulk import among, among_bound, listed
from lowtide.store.db import Store
from lowtide.store.payloads import payload_text
from lowtide.store.queries import get_job, stored_bytes
from lowtide.store.schema import requests

_RESULT_COLUMNS = (
    "custom_id", "state", "output", "error", "input_tokens", "output_tokens", "attempts", "route", "source_changed",
    *ANSWER_COLUMNS,
)  # fmt: skip
_OWN = frozenset(_RESULT_COLUMNS) | {"response"}  # a parsed field named so is `answer_<name>` (with or without `full`)
# The state of a row whose answer a prune dropped from the store (an export-only state, as
# `not_loaded` is: the request itself stays succeeded).
PRUNED_STATE = "pruned"
PAGE_BYTES = 8 << 20  # stored answers read at once, at most (one bigger answer is read alone)
INLINE_BYTES = 4096  # answers this small come with the chunk's lookup (5,000 of them: 20 MB at most)


@dataclass(slots=True)
class ExportReport:
    path: Path | str  # a local file or folder, an object-store URL, or a SQL table in words
    rows: int
    states: dict[str, int]
    files: list[str] = field(default_factory=list)  # a partitioned dataset's, relative to `path`
    table: bool = False  # upserted into a SQL table (which keeps its copy of a pruned answer)

    def pruned_note(self) -> str | None:
        """What the results say of answers a prune dropped from the store; None where none was."""
        n = self.states.get(PRUNED_STATE, 0)
        if not n:
            return None
        kept = "their rows in the table are kept as they were" if self.table else f"those rows have state {PRUNED_STATE} and no answer"
        return f"{n:,} answers pruned from the store: {kept}"


class ResultColumns:
    """A job's result columns, known from its spec and its source (`columns`: a preflight
    asks before the job is stored)."""

    def __init__(self, spec: JobSpec, full: bool = False):
        self.full = full  # add `response`: the provider's whole answer body
        self.spec = spec
        try:
            self.source = source_of(self.spec)
        except LowtideError as err:
            raise LowtideError(f"cannot join results to the source: {err}") from None
        props = (self.spec.response_schema or {}).get("properties") if self.spec.response_schema else None
        self.parsed_fields: list[str] = list(props) if isinstance(props, dict) else []
        self.whole_parsed = self.spec.response_schema is not None and not self.parsed_fields
        # A parsed field's key in `result_columns`, apart from lowtide's own column names.
        self.parsed_keys = {f: f"parsed:{f}" for f in self.parsed_fields}
        self.parsed_schemas: dict[str, Any] = (  # by key in `result_columns`
            {self.parsed_keys[f]: props[f] for f in self.parsed_fields} if self.parsed_fields
            else {"parsed": self.spec.response_schema} if self.whole_parsed else {}
        )  # fmt: skip
        self.source_columns: list[str] | None = self.source.columns

    def result_columns(self, source_columns: list[str]) -> dict[str, str]:
        """lowtide's columns, key -> column name: lowtide's own under their names, a parsed
        field under `parsed:<field>`. A field named like one of lowtide's columns is
        `answer_<field>`; any name the source (or a column before it) already has is
        prefixed with `lowtide_`, so no two columns share a name."""
        fields = set(self.parsed_fields)
        wanted = [(n, n) for n in _RESULT_COLUMNS[:3]]
        wanted += [(self.parsed_keys[f], _unique(f"answer_{f}", fields | _OWN) if f in _OWN else f) for f in self.parsed_fields]
        wanted += [("parsed", "parsed")] if self.whole_parsed else []
        wanted += [(n, n) for n in _RESULT_COLUMNS[3:]]
        wanted += [("response", "response")] if self.full else []
        taken = set(source_columns)
        names: dict[str, str] = {}
        for key, name in wanted:
            names[key] = name = _unique(f"lowtide_{name}", taken) if name in taken else name
            taken.add(name)
        return names

    def columns(self) -> list[str]:
        """Every column of the results: the source's, then lowtide's."""
        return [*self.known_source_columns(), *self.result_columns(self.known_source_columns()).values()]

    def known_source_columns(self) -> list[str]:
        """The source's columns. A JSONL source's are every key of any of its rows, in the
        order they first appear: a pass over the source of its own (a key that first
        appears late, a `priority` added to a feed one day, is a column like the others)."""
        if self.source_columns is None:
            self.source_columns = self.source.keys()
        return self.source_columns


class ResultRows(ResultColumns):
    """Iterate a job's results joined to its source, in source order."""

    def __init__(self, store: Store, job_name: str, full: bool = False):
        self.store = store
        self.answers_renamed = False  # does the source have a column named like an answer column?
        self._wanted: Select | None = None  # the lookup statement (`_lookup_statement`)
        self._next: Select | None = None  # the window's (`_window_statement`)
        with store.read() as conn:
            job = get_job(conn, job_name)
        self.job_id = job.id
        super().__init__(stored_spec(job.spec), full)
        try:  # the loader's own rendering, for the fingerprints
            self.render: RowRenderer | None = RowRenderer(self.spec, MessageTemplate.from_spec(self.spec), self.source)
        except LowtideError:  # a template file gone since: changes cannot be told (source_changed empty)
            self.render = None

    def chunks(self) -> Iterator[list[dict[str, Any]]]:
        names = self.result_columns(self.known_source_columns())
        self.answers_renamed = any(names[n] != n for n in ANSWER_COLUMNS)
        for rows in self._joined():
            for page in _pages(rows):
                answers = self._answers([res[12] for _, _, res in page if res is not None and (res[13] or 0) > INLINE_BYTES])
                yield self._records(page, answers, names)

    def changed_requests(self) -> Iterator[int]:
        """The stored request ids (`requests.id`) of the rows that, rendered now, differ from
        what their request was rendered from: a pass in source order, a chunk at a time, as
        the results' `source_changed` is told (an embedding job's vectors: vector_export.py)."""
        if self.render is None:
            return
        for rows in self._joined():
            for row, _, res in rows:
                if res is not None and _changed(self.render, row, res[10], res[11]):
                    yield res[12]

    def _joined(self) -> Iterator[list[tuple]]:
        """Each source chunk's rows as (row, custom_id, its stored request or None)."""
        id_col = self.spec.source.id_column
        newest = self._newest()
        window = _Window()  # this pass's
        for chunk in self.source.chunks():
            if newest is not None:  # an older version of a row of an increment: its request is the newest's
                chunk = [r for r in chunk if not newest.older(row_id(r.values, id_col, self.spec.variant), r.values)]
            keys = [str(r.values.get(id_col, "")).strip() for r in chunk]
            variant = self.spec.variant
            ids = [custom_id_of(k, variant) for k in keys]
            found = self._lookup(ids, keys, window)
            yield [(row, cid, found.get(cid)) for row, cid in zip(chunk, ids, strict=True)]

    def _newest(self) -> Newest | None:
        """Where an increment source holds an id in several rows, each id's newest (docs/data.md
        "Nightly increments"): a pass over the ids, and one over the rows of repeated ids."""
        since, id_col, variant = self.spec.source.since, self.spec.source.id_column, self.spec.variant
        if since is None:
            return None
        ids = IdWatch()
        for chunk in self.source.chunks(strict=False):  # its problems are raised by the pass that writes
            for row in chunk:
                if (cid := row_id(row.values, id_col, variant)) is not None:
                    ids.add(cid)
        if not ids.has_repeats():
            return None
        return Newest.of(repeated_rows(self.source, id_col, ids, variant), since.column)

    def _records(self, page: list[tuple], answers: dict[int, str], names: dict[str, str]) -> list[dict[str, Any]]:
        """A page's output records: each the source row, then lowtide's columns in the order
        of `result_columns` (JSONL and DataFrames keep a record's order), but for
        `source_changed`, which comes after `custom_id` (as it always has). A 100,000-row
        export builds 100,000 of them: names and flags are bound once per page, not per row."""
        k_cid, k_state, k_output, k_error, k_in, k_out, k_tries, k_route, k_changed = (names[n] for n in _RESULT_COLUMNS[:9])
        fields = [(f, names[key]) for f, key in self.parsed_keys.items()]
        k_parsed = names["parsed"] if self.whole_parsed else None
        decode = bool(fields) or self.whole_parsed
        renamed = names if self.answers_renamed else None
        k_response = names["response"] if self.full else None
        render = self.render
        flags = _changes(render, page) if render is not None else [None] * len(page)
        plains: dict[str, dict[str, Any]] = {}  # a page's plain answers share a few finish reasons
        records = []
        append = records.append
        for (row, cid, res), flag in zip(page, flags, strict=True):
            record = dict(row.values)
            if res is None:
                record[k_cid] = cid
                record[k_state] = "not_loaded"
                append(record)
                continue
            cid, state, output, parsed, error_code, error_message, input_tokens, output_tokens, tries, route, _, _, rid, _, text, plain, dropped, _ = res
            record[k_cid] = cid  # as stored (a legacy custom_id where it was found under one)
            if render is not None:
                record[k_changed] = flag
            record[k_state] = PRUNED_STATE if dropped else state
            record[k_output] = output
            if decode:
                parsed = fastjson.loads(parsed) if parsed else None
                if fields:
                    got = parsed if isinstance(parsed, dict) else {}
                    for f, key in fields:
                        record[key] = got.get(f)
                else:
                    record[k_parsed] = parsed
            record[k_error] = f"{error_code}: {error_message}" if state != "succeeded" and error_code else None
            record[k_in] = input_tokens
            record[k_out] = output_tokens
            record[k_tries] = tries
            record[k_route] = route
            if plain is not None:  # its response is not read (not `full`), or gone (a prune kept its answer columns)
                response = None
                values = plains.get(plain)
                if values is None:
                    values = plain_values(plain)
                    if plain[:1] != "{":  # a kept record is a dict of its own (plain_values)
                        plains[plain] = values
            else:
                if text is None:
                    text = answers.get(rid)
                response = fastjson.loads(text) if text else None
                values = answer_values(response)
            if renamed is None:
                record.update(values)
            else:
                for name, value in values.items():
                    record[renamed[name]] = value
            if k_response is not None:
                record[k_response] = response
            append(record)
        return records

    def _answers(self, row_ids: list[int]) -> dict[int, str]:
        """request id -> its stored response (JSON text)."""
        if not row_ids:
            return {}
        with self.store.read() as conn:
            stmt = select(requests.c.id, requests.c.response).where(among(conn, requests.c.id, row_ids))
            return dict(conn.execute(stmt).all())

    def _lookup(self, ids: list[str], keys: list[str], window: _Window | None = None) -> dict[str, Row]:
        """custom_id -> (stored custom_id, state, output, parsed, error_code, error_message,
        input_tokens, output_tokens, attempts, route, fingerprint, payload if no fingerprint,
        row id, length of the stored response, the response if at most INLINE_BYTES, its
        `plain_answer`, whether a prune dropped its answer, its source_key) of the job's requests among `ids`;
        an id not found is looked for under its legacy custom_ids too, taken where stored for its own key. Larger responses are read page by page (`_answers`). Where
        the plain answer is taken, and `full` wants no response, the response is not read: its
        length and text are NULL. With a `window`, the job's next requests in id order are read
        first (`_window_read`), and the ids it did not find looked up."""
        with self.store.read() as conn:
            if self._wanted is None:
                self._wanted = self._lookup_statement(conn)
                self._next = self._window_statement()

            def fetch(wanted: list[str]) -> dict[str, Row]:
                rows = conn.execute(self._wanted, {"wanted": listed(conn, wanted)})
                return {r[0]: r for r in rows.fetchall()}  # whole: no fetch per row; Rows unpack as tuples do

            found = self._window_read(conn, ids, window) if window is not None and window.on and ids else {}
            rest = [cid for cid in ids if cid not in found] if found else ids
            if rest:
                found.update(fetch(rest))
            legacy: dict[str, list[tuple[str, str]]] = {}
            for cid, key in zip(ids, keys, strict=True):
                if cid not in found:
                    for old in legacy_custom_ids(key, self.spec.variant):
                        legacy.setdefault(old, []).append((cid, key_of(key)))
            if legacy:  # two keys can share an 8-digit legacy id: the stored key tells whose it is
                for old, res in fetch(list(legacy)).items():
                    for cid, key in legacy[old]:
                        if key == key_of(res[17]):
                            found.setdefault(cid, res)
            if window is not None and window.on and found:  # the next window starts past this chunk's requests
                window.after = max(window.after or 0, max(res[12] for res in found.values()))
            return found

    def _window_read(self, conn, ids: list[str], window: _Window) -> dict[str, Row]:
        """Those of `ids` among the job's next len(ids) requests in id order (those past
        `window.after`): where the requests were stored in source order, as a load stores
        them, a chunk's are read by a range of the primary key, at less cost than a probe of
        the custom_id index for each. Once less than half of two windows in a row was the
        chunk's (a source in another order) the pass reads no more windows: one such window
        alone may be rows gone from the source, which the next window is past."""
        if window.after is None:  # the first window starts at the request of the chunk's first row
            # (found by its custom_id: the job's least id would be a pass over its index)
            first = conn.execute(self._wanted, {"wanted": listed(conn, ids[:1])}).fetchall()
            if not first:  # none: the chunk is looked up by id, the next window starts past what that finds
                return {}
            window.after = first[0][12] - 1
        wanted = set(ids)
        rows = conn.execute(self._next, {"after": window.after, "upto": window.after + len(ids)}).fetchall()
        found = {r[0]: r for r in rows if r[0] in wanted}
        window.misses = window.misses + 1 if 2 * len(found) < len(wanted) else 0
        window.on = window.misses < 2
        return found

    def _window_statement(self) -> Select:
        """`_lookup_statement`'s columns, of the job's requests with ids in (`after`, `upto`].
        `job_id + 0`: read along the primary key, never through the job's index."""
        cols = requests.c
        return self._lookup_columns().where((cols.job_id + 0) == self.job_id, cols.id > bindparam("after"), cols.id <= bindparam("upto"))

    def _lookup_statement(self, conn) -> Select:
        """`_lookup`'s statement, built once per export: its custom_ids are bound when it runs
        (`among_bound`), so no chunk's ids stay held by a statement in reference cycles (one
        built per chunk kept 20 MB per million rows until a collection)."""
        cols = requests.c
        return self._lookup_columns().where(cols.job_id == self.job_id, among_bound(conn, cols.custom_id, "wanted"))

    def _lookup_columns(self) -> Select:
        """The columns `_lookup` reads of a request (its docstring lists them)."""
        cols = requests.c
        # Written and cleared with its response (a request started again has neither, whatever
        # is left), but by `prune --keep-results`, which drops the response and keeps it (a
        # plain record beside the payload it prunes, or the whole record it writes, a JSON
        # object: engine/kept_answers.py): then it is all the answer columns have left.
        left = case(
            (and_(cols.response.is_(None), or_(cols.payload == PRUNED, cols.plain_answer.startswith("{"))), cols.plain_answer),
            else_=None,
        )
        # Beside a response, the plain record is read instead of it (not with `full`, which reads it).
        plain = left if self.full else case((cols.response.is_not(None), cols.plain_answer), else_=left)
        length = case((plain.is_(None), stored_bytes(cols.response)), else_=None)
        # Every succeeded request was stored with a response: one left with no response, text,
        # parsed answer or kept record of its answer columns lost them to a prune.
        dropped = and_(
            cols.state == RequestState.SUCCEEDED.value, cols.response.is_(None), cols.output.is_(None), cols.parsed.is_(None),
            left.is_(None),
        )  # fmt: skip
        # Read as the driver gives it (SQLite: 0 or 1), only ever asked whether true: a
        # Boolean's result processor, a Python call per row, cost a fifth of the lookup.
        dropped = type_coerce(dropped, Integer)
        return select(
            cols.custom_id, cols.state, cols.output, cols.parsed, cols.error_code, cols.error_message,
            cols.input_tokens, cols.output_tokens, cols.attempts, cols.route, cols.fingerprint,
            case((cols.fingerprint.is_(None), payload_text()), else_=None),  # stored before fingerprints
            cols.id, length, case((length <= INLINE_BYTES, cols.response), else_=None), plain, dropped, cols.source_key,
        )  # fmt: skip


@dataclass(slots=True)
class _Window:
    """Where a pass's window read (`ResultRows._window_read`) is: past request id `after`
    (None: not started), the windows in a row that were mostly not the chunk's, and whether
    it still reads windows."""

    after: int | None = None
    misses: int = 0
    on: bool = True


def _unique(name: str, taken: set[str] | frozenset[str]) -> str:
    """`name`, prefixed again (`answer_answer_state`, `lowtide_lowtide_state`) while taken."""
    prefix = name.split("_", 1)[0] + "_"
    while name in taken:
        name = prefix + name
    return name


def _pages(rows: list[tuple]) -> Iterator[list[tuple]]:
    """A chunk's rows in runs whose stored responses add up to at most PAGE_BYTES."""
    page: list[tuple] = []
    size = 0
    for item in rows:
        res = item[2]
        n = (res[13] or 0) if res is not None and res[14] is None else 0  # inlined answers are read already
        if page and size + n > PAGE_BYTES:
            yield page
            page, size = [], 0
        page.append(item)
        size += n
    if page:
        yield page


def _changes(render: RowRenderer, page: list[tuple]) -> list[bool | None]:
    """`_changed` of each page row with a stored request (None for one without): where every
    row has one, with a fingerprint, and no optional columns to fill in (the commonest page),
    the rows are hashed in one call (RowRenderer.fingerprints)."""
    stored = [None if res is None else res[10] for _, _, res in page]
    if not render.optional and None not in stored:
        return list(map(ne, render.fingerprints([row.values for row, _, _ in page]), stored))
    return [None if res is None else _changed(render, row, res[10], res[11]) for row, _, res in page]


def _changed(render: RowRenderer, row, fingerprint: str | None, payload: str | None) -> bool:
    """Does the row, as it is now, render otherwise than its stored request? Without a
    stored fingerprint it is rendered and the payloads compared; a row that no longer
    renders at all (a problem: str) has changed too."""
    if fingerprint is not None:
        return render.fingerprint(render.values_of(row)) != fingerprint
    item = render(row)
    return item.__class__ is str or item["payload"] != payload


def export_results(store: Store, job_name: str, out: str | Path, fmt: str | None = None, full: bool = False) -> ExportReport:
    """Write the joined results to `out` (CSV, JSONL or Parquet by extension; a local path or
    an object-store URL), atomically; `full` adds each provider's whole answer body (`response`)."""
    if _is_embedding_job(store, job_name):  # vectors, not answers (engine/vector_export.py)
        from lowtide.engine.vector_export import export_vectors

        report = export_vectors(store, job_name, out)
        return ExportReport(report.path, report.rows, report.states)
    return write_rows(ResultRows(store, job_name, full=full), out, format_of(_name(out), fmt))


def write_target(store: Store, job_name: str, target: OutputTarget, full: bool = False) -> ExportReport:
    """Write the job's results where `target` says: a file (export_results), a partitioned
    dataset (partitions.py) or a SQL table (sql_sink.py)."""
    if target.table is not None:
        from lowtide.engine.sql_sink import upsert_results

        count, states = upsert_results(ResultRows(store, job_name, full=full), target.url, target.table)
        return ExportReport(target.shown, count, states, table=True)
    if target.partition_by:
        from lowtide.engine.partitions import write_partitioned

        loc = location(target.path)
        count, states, files = write_partitioned(ResultRows(store, job_name, full=full), loc, target.fmt or "parquet", list(target.partition_by))
        return ExportReport(_shown_path(loc, target.path), count, states, files)
    return export_results(store, job_name, target.path, target.fmt, full)


def write_rows(rows: ResultRows, out: str | Path, fmt: str) -> ExportReport:
    """Write `rows` (a job's, or an eval's long table: engine/eval_export.py) to `out`, a local
    path or an object-store URL, whole or not at all (committed.py)."""
    loc = location(str(out))
    states: dict[str, int] = {}
    count = 0
    with committed(loc) as f:
        writer = WRITERS[fmt](f, rows)
        for chunk in tally(rows, states):
            writer.write(chunk)
            count += len(chunk)
        writer.close()
    return ExportReport(_shown_path(loc, out), count, states)


def _name(out: str | Path) -> str:
    """The file name of a path or URL (its extension names the format)."""
    return str(out).rstrip("/").rsplit("/", 1)[-1]


def _shown_path(loc, out: str | Path) -> Path | str:
    """A local path as the caller gave it; a URL as written."""
    return Path(str(out).removeprefix("file://")) if loc.local else loc.text


def _is_embedding_job(store: Store, job_name: str) -> bool:
    from lowtide.core.endpoints import EMBEDDINGS

    with store.read() as conn:
        job = get_job(conn, job_name)
    return stored_spec(job.spec).request_endpoint == EMBEDDINGS
