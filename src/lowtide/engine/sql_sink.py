"""Results upserted into a SQL table (`output.url` + `output.table`), keyed by custom_id.

The table is made when missing, its columns typed from the same Arrow schema the Parquet
results have (result_writers.py `ArrowLayout`): integers BIGINT, floats FLOAT (double
precision), flags BOOLEAN, text TEXT, timestamps TIMESTAMP WITH TIME ZONE, dates DATE, and
nested values (structs, lists: parsed objects, tool calls, logprobs) JSONB on PostgreSQL,
JSON elsewhere; `custom_id` is the primary key. Every row is written with INSERT ... ON
CONFLICT (custom_id) DO UPDATE (PostgreSQL, SQLite), all in one transaction: a failure
half-way leaves the table as it was, and running the export again changes nothing. A row
whose answer a prune dropped from the store (state `pruned`, export.py) is written with DO
NOTHING instead: the table's copy, answer and all, is kept; a table without one gets the row.

An existing table keeps its own column types. One missing a results column, one whose
column cannot take the results' values (PostgreSQL: a TEXT column for token counts, an
INTEGER one for the answer; SQLite's columns take any value), or one without a unique key on
custom_id, is refused before the run (preflight.py) with the statement that fixes it. A job
with no rows still makes its (empty) table. The URL holds no password: the driver's own chain gives it (PGPASSWORD,
~/.pgpass, a service file).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from lowtide.core.errors import LowtideError, SpecError
from lowtide.core.sql_urls import shown_url
from lowtide.engine.export import PRUNED_STATE
from lowtide.engine.result_writers import ArrowLayout, output_columns

DIALECTS = ("postgresql", "sqlite")
DATABASES = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}  # as messages name them


class DecimalText(sa.types.TypeDecorator):
    """A decimal in SQLite, which has none: its exact digits as text (a NUMERIC column would
    keep a float's 15 or so: 12345678901234567890.12 became 1.2345678901234567e+19)."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else str(value)


def sql_type(kind: Any, dialect: str) -> sa.types.TypeEngine:
    """The column type for values of Arrow type `kind`."""
    import pyarrow as pa

    t = pa.types
    if t.is_dictionary(kind):
        kind = kind.value_type
    if t.is_boolean(kind):
        return sa.Boolean()
    if t.is_integer(kind):
        return sa.BigInteger()
    if t.is_floating(kind):
        return sa.Float()
    if t.is_decimal(kind):
        return sa.Numeric(kind.precision, kind.scale) if dialect == "postgresql" else DecimalText()
    if t.is_timestamp(kind):
        return sa.DateTime(timezone=True)
    if t.is_date(kind):
        return sa.Date()
    if t.is_time(kind):
        return sa.Time()
    if t.is_binary(kind) or t.is_large_binary(kind) or t.is_fixed_size_binary(kind):
        return sa.LargeBinary()
    if t.is_nested(kind):
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return JSONB(none_as_null=True)
        return sa.JSON(none_as_null=True)
    return sa.Text()


def engine_for(url: str) -> sa.Engine:
    """An engine for `url`; PostgreSQL without a named driver through psycopg (3), which
    lowtide[postgres] installs."""
    u = sa.engine.make_url(url)
    if u.drivername == "postgresql":
        u = u.set(drivername="postgresql+psycopg")
    try:
        return sa.create_engine(u)
    except Exception as err:  # an unknown dialect or a driver not installed
        raise SpecError(f"output.url {shown_url(url)}: cannot connect ({_reason(err)}); install the database's driver "
                        "(for PostgreSQL: pip install 'lowtide[postgres]')") from None  # fmt: skip


def _reason(err: BaseException) -> str:
    text = str(getattr(err, "orig", None) or err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _split(table: str) -> tuple[str | None, str]:
    schema, _, name = table.rpartition(".")
    return schema or None, name


def _table(name: str, layout: ArrowLayout, id_column: str, dialect: str) -> sa.Table:
    schema, plain = _split(name)
    columns = [sa.Column(f.name, sql_type(f.type, dialect), primary_key=f.name == id_column) for f in layout.schema]
    return sa.Table(plain, sa.MetaData(), *columns, schema=schema)


def check_table(rows: Any, url: str, table: str) -> None:
    """Before the run: the database answers, speaks an upsert lowtide writes, and an existing
    `table` has every results column and a unique key on custom_id. `rows`: the job's
    result columns (export.py `ResultColumns`)."""
    engine = engine_for(url)
    try:
        if engine.dialect.name not in DIALECTS:
            raise SpecError(f"output.url {shown_url(url)}: results are upserted into PostgreSQL or SQLite tables, "
                            f"not {engine.dialect.name}; write a file (output.path) and load it")  # fmt: skip
        try:
            with engine.connect() as conn:
                problem = _table_problem(conn, rows, table, engine.dialect)
        except SpecError:
            raise
        except Exception as err:
            raise SpecError(f"output.url {shown_url(url)}: cannot connect ({_reason(err)}); check the URL, and give a "
                            "password the driver's own way (PGPASSWORD or ~/.pgpass), never in the spec") from None  # fmt: skip
        if problem:
            raise SpecError(f"output.table {table}: {problem}")
    finally:
        engine.dispose()


def _table_problem(conn: sa.Connection, rows: Any, table: str, dialect: Any) -> str | None:
    too_long = _name_problem(rows, dialect)
    if too_long:
        return too_long
    schema, name = _split(table)
    inspector = sa.inspect(conn)
    if not inspector.has_table(name, schema=schema):
        return None  # made by the export
    have = {c["name"] for c in inspector.get_columns(name, schema=schema)}
    wanted = output_columns(rows)
    missing = [c for c in wanted if c not in have]
    if missing:
        types = ArrowLayout(rows, only=missing).schema
        fixes = "; ".join(
            f"ALTER TABLE {_quoted(conn, table)} ADD COLUMN {conn.dialect.identifier_preparer.quote(c)} "
            f"{sql_type(types.field(c).type, dialect.name).compile(dialect=dialect)}"
            for c in missing
        )
        names = ", ".join(f'"{c}"' for c in missing)
        return f"has no column {names}, which the results have; add {'it' if len(missing) == 1 else 'them'}: {fixes}"
    id_column = rows.result_columns(rows.source_columns or [])["custom_id"]
    keys = [inspector.get_pk_constraint(name, schema=schema).get("constrained_columns") or []]
    keys += [u["column_names"] for u in inspector.get_unique_constraints(name, schema=schema)]
    keys += [i["column_names"] for i in inspector.get_indexes(name, schema=schema) if i.get("unique")]
    if [id_column] not in keys:
        return (f'has no primary key or unique index on "{id_column}", which the upsert is keyed by; add one: '
                f"CREATE UNIQUE INDEX ON {_quoted(conn, table)} ({conn.dialect.identifier_preparer.quote(id_column)})")  # fmt: skip
    if dialect.name == "postgresql":  # SQLite's columns take any value
        return _type_problem(conn, inspector, rows, table, wanted, dialect)
    return None


def _name_problem(rows: Any, dialect: Any) -> str | None:
    """A results column whose name the database would cut (PostgreSQL keeps 63 bytes of a
    name): two columns alike in their first 63 bytes would be one, and a table made with a
    cut name never again has the column the results name."""
    limit = dialect.max_identifier_length
    long = [c for c in output_columns(rows) if len(c.encode()) > limit]
    if not long:
        return None
    names = ", ".join(f'"{c}" ({len(c.encode())} bytes)' for c in long)
    return (f"column {names}: {DATABASES.get(dialect.name, dialect.name)} keeps names of at most {limit} bytes; rename "
            f"{'it' if len(long) == 1 else 'them'} in the source (its header, or an AS in source.query), or write a file (output.path)")


def _family(kind: sa.types.TypeEngine) -> str | None:
    """What values a column type takes, coarsely; None for a type not judged here."""
    for family, types in (("bool", sa.Boolean), ("int", sa.Integer), ("number", (sa.Numeric, sa.Float)), ("json", sa.JSON),
                          ("timestamp", sa.DateTime), ("date", sa.Date), ("time", sa.Time),
                          ("binary", sa.LargeBinary), ("text", sa.String)):  # fmt: skip
        if isinstance(kind, types):
            return family
    return None


def _takes(have: str | None, ours: str | None) -> bool:
    """Whether a column of family `have` takes values of family `ours` (an integer fits a
    numeric or float column)."""
    return have is None or ours is None or have == ours or (ours == "int" and have == "number")


def _type_problem(conn: sa.Connection, inspector: Any, rows: Any, table: str, wanted: list[str], dialect: Any) -> str | None:
    """The existing columns whose type cannot take the results' values, with the fix."""
    schema, name = _split(table)
    declared = {c["name"]: c["type"] for c in inspector.get_columns(name, schema=schema)}
    types = ArrowLayout(rows, only=wanted).schema
    q = conn.dialect.identifier_preparer.quote
    clashes = []
    for c in wanted:
        ours = sql_type(types.field(c).type, dialect.name)
        if not _takes(_family(declared[c]), _family(ours)):
            clashes.append((c, declared[c].compile(dialect=dialect), ours.compile(dialect=dialect)))
    if not clashes:
        return None
    what = ", ".join(f'"{c}" is {have} but the results\' are {ours}' for c, have, ours in clashes)
    fixes = "; ".join(f"ALTER TABLE {_quoted(conn, table)} ALTER COLUMN {q(c)} TYPE {ours} USING {q(c)}::{ours}" for c, _, ours in clashes)
    return f"column {what}; change {'it' if len(clashes) == 1 else 'them'} ({fixes}), or name a new table for lowtide to make"


def _quoted(conn: sa.Connection, table: str) -> str:
    q = conn.dialect.identifier_preparer.quote
    return ".".join(q(part) for part in table.split(".", 1))


def upsert_results(rows: Any, url: str, table: str) -> tuple[int, dict[str, int]]:
    """Upsert `rows` into `table` (see the module): (rows written, rows per state)."""
    engine = engine_for(url)
    if engine.dialect.name not in DIALECTS:
        raise LowtideError(f"output.url {shown_url(url)}: results are upserted into PostgreSQL or SQLite tables, not {engine.dialect.name}")
    states: dict[str, int] = {}
    count = 0
    try:
        with engine.begin() as conn:
            rows.columns()  # a JSONL source's columns are every key of its rows: known before the table is made
            problem = _table_problem(conn, rows, table, engine.dialect)
            if problem:
                raise LowtideError(f"output.table {table}: {problem}")
            names = rows.result_columns(rows.source_columns or [])
            layout = ArrowLayout(rows)
            sql_table = _table(table, layout, names["custom_id"], engine.dialect.name)
            sql_table.create(conn, checkfirst=True)  # a job with no rows still gets its table
            stmt = _upsert(sql_table, names["custom_id"], engine.dialect.name)
            keep = _insert(sql_table, engine.dialect.name).on_conflict_do_nothing(index_elements=[sql_table.c[names["custom_id"]]])
            for chunk in rows.chunks():
                for r in chunk:
                    states[r[names["state"]]] = states.get(r[names["state"]], 0) + 1
                values = layout.table(chunk).to_pylist()
                answered = [v for v in values if v[names["state"]] != PRUNED_STATE]
                pruned = [v for v in values if v[names["state"]] == PRUNED_STATE]
                for statement, batch in ((stmt, answered), (keep, pruned)):
                    if batch:
                        conn.execute(statement, batch)
                count += len(chunk)
    except LowtideError:
        raise
    except sa.exc.SQLAlchemyError as err:
        raise LowtideError(f"output.url {shown_url(url)} table {table}: the upsert failed, nothing was written ({_reason(err)})") from None
    finally:
        engine.dispose()
    return count, states


def _insert(table: sa.Table, dialect: str):
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table)


def _upsert(table: sa.Table, id_column: str, dialect: str):
    stmt = _insert(table, dialect)
    return stmt.on_conflict_do_update(
        index_elements=[table.c[id_column]], set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name != id_column}
    )
