"""Executing one Core statement for many rows: persisting requests, applying outcomes,
recording attempts.

SQLite: the driver's own executemany. SQLAlchemy's per-row parameter processing costs more
than SQLite's insert itself at 100k rows, so the statement is compiled once, with positional
parameters, and each row's dict goes to the driver as a tuple in the statement's order:
drivers bind a tuple by position, cheaper than looking every name up in a dict (sqlite3 asks
SQLite for each parameter's name, per row).

PostgreSQL: one set-based statement for all the rows. Each row statement costs the server a
parse, bind and execute of its own (psycopg pipelines them, but runs each), and the client
a conversion of each value; so the rows travel as one JSON array, read back as a table by
`json_to_recordset`, and the statement is rewritten to take its per-row values from that
table: `INSERT … SELECT … FROM rows`, and for a statement that finds each row by its key
(`by_key`), `UPDATE … FROM rows WHERE id = rows._id` or `DELETE … USING rows`. The JSON is
written by lowtide's fastjson, so a NaN or infinite float arrives as NULL (no such value is
stored by lowtide).

An INSERT on PostgreSQL goes by `COPY` where it can, finished in the background while the
caller goes on (store/copying.py says why and how); where it cannot, by the set-based
statement.

Why an UPDATE must say so: PostgreSQL plans the join of the table with the rows, and
estimates the table's side from statistics taken before this transaction. `dispatch_id =
7` right after a claim is estimated at one row (when the statistics were taken no request
was in dispatch 7), so the planner scans the dispatch's index and, for each of its 5,000
requests, every row of the JSON again: 25 million comparisons, 10 s instead of 0.1 s. An
UPDATE run together therefore finds its rows only by the key, and checks every other
condition as a `guard`, which PostgreSQL cannot use to find rows nor misjudge as few.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Dialect,
    Text,
    bindparam,
    cast,
    column,
    func,
    literal,
    literal_column,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import Executable, Insert, Update, visitors
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.types import NullType, TypeEngine

from lowtide.core import fastjson
from lowtide.store.copying import FIXED, copy_in_background

_SQLITE_QMARK = sqlite.dialect(paramstyle="qmark")


def _positional(dialect: Dialect) -> Dialect:
    """`dialect`, compiling `%s` where it compiles `%(name)s` (psycopg takes both): a copy,
    so that everything else the live dialect knows (server version, casts) is kept. Made
    once per engine and kept on its dialect (a cache keyed by dialect would keep each alive:
    the copy refers back to it)."""
    if dialect.name == "sqlite":
        return _SQLITE_QMARK
    if dialect.positional:
        return dialect
    found = dialect.__dict__.get("_lowtide_positional")
    if found is None:
        if dialect.paramstyle != "pyformat":
            raise ValueError(f"bulk.executemany cannot bind by position with paramstyle {dialect.paramstyle}")
        found = copy.copy(dialect)
        found.paramstyle, found.positional = "format", True
        dialect.__dict__["_lowtide_positional"] = found
    return found


def executemany(conn: Connection, stmt: Executable, rows: Sequence[dict[str, Any]], *, by_key: bool = False) -> None:
    """Run `stmt` once per row. Rows give every bind parameter the statement does not fix
    (all rows the same keys). `by_key`: an UPDATE or DELETE whose WHERE finds each row by a
    key bound per row (`id = bindparam("_id")`), each row named once, and checks anything
    else as a `guard`: on PostgreSQL it then runs for all rows in one statement, as an
    INSERT always does (see the module doc)."""
    if not rows:
        return
    if conn.dialect.name == "postgresql" and (by_key or isinstance(stmt, Insert)):
        if isinstance(stmt, Insert) and copy_in_background(conn, stmt, rows, lambda: _set_based_sql(conn, stmt, rows)):
            return
        conn.execute(_set_based(stmt, list(rows[0])), {_ROWS: fastjson.dumps(rows)})
        return
    first = rows[0]
    # An INSERT without .values() names its columns from the rows (so ids stay automatic).
    keys = list(first) if isinstance(stmt, Insert) and not stmt._values else None
    # for_executemany: no RETURNING of the new ids, which nobody reads here.
    compiled = stmt.compile(dialect=_positional(conn.dialect), column_keys=keys, for_executemany=True)
    if compiled.escaped_bind_names:  # names SQLAlchemy renames in the SQL; lowtide uses none
        raise ValueError(f"bulk.executemany needs plain parameter names, not {sorted(compiled.escaped_bind_names)}")
    order = compiled.positiontup or []
    # Values the statement itself fixes (e.g. state = 'succeeded' in a WHERE).
    constant = {k: v for k, v in compiled.params.items() if k not in first}
    if constant:
        rows = [{**constant, **r} for r in rows]
    if len(order) > 1:
        params = list(map(itemgetter(*order), rows))
    else:  # itemgetter of one name gives the value itself, not a 1-tuple
        params = [tuple(r[name] for name in order) for r in rows]
    conn.exec_driver_sql(str(compiled), params)


_ROWS = "_lowtide_rows"


def _set_based_sql(conn: Connection, stmt: Executable, rows: Sequence[dict[str, Any]]) -> tuple[str, dict]:
    """The set-based statement as the driver takes it: for a COPY's thread, which runs it on
    the driver's connection where a row was already stored."""
    compiled = _set_based(stmt, list(rows[0])).compile(dialect=conn.dialect)
    return str(compiled), compiled.construct_params({_ROWS: fastjson.dumps(rows)})


def _set_based(stmt: Executable, keys: list[str]) -> Executable:
    """`stmt`, taking each row's values from the JSON array bound as `_ROWS` (one statement
    for every row; see the module doc)."""
    table = stmt.table
    given = dict(stmt._values or {}) if isinstance(stmt, Insert | Update) else {}
    if isinstance(stmt, Insert) and not given:  # an INSERT naming its columns by the rows' keys
        given = {k: bindparam(k) for k in keys}
    types: dict[str, TypeEngine] = {}
    for name, value in given.items():  # a bound value set on a column takes the column's type
        if isinstance(value, BindParameter) and value.key in keys and isinstance(value.type, NullType):
            types[value.key] = table.c[name if isinstance(name, str) else name.key].type
    for element in visitors.iterate(stmt):
        if isinstance(element, BindParameter) and element.key in keys and element.key not in types:
            types[element.key] = element.type
    named = [k for k in keys if k in types]  # keys the statement never names are not read
    rows = (
        func.json_to_recordset(cast(bindparam(_ROWS, type_=Text), postgresql.JSON))
        .table_valued(*[column(k, _sql_type(types[k], table, k)) for k in named])
        .render_derived(name="_rows", with_types=True)
    )

    def from_rows(element):
        if isinstance(element, BindParameter) and element.key in types:
            return rows.c[element.key]
        return None

    if not isinstance(stmt, Insert):  # UPDATE … FROM rows, DELETE … USING rows
        return visitors.replacement_traverse(stmt, {}, from_rows)
    values = [visitors.replacement_traverse(v, {}, from_rows) for v in given.values()]
    into = stmt._generate()  # keeps what follows VALUES (ON CONFLICT …)
    into._values = None
    return into.from_select(list(given), select(*values).select_from(rows))


def _sql_type(found: TypeEngine, table, key: str) -> TypeEngine:
    if not isinstance(found, NullType):
        return found
    return table.c[key].type if key in table.c else Text()


def among(conn: Connection, column: ColumnElement[Any], values: Sequence[Any]) -> ColumnElement[bool]:
    """`column IN values` for thousands of values, sent as one parameter (a JSON array on
    SQLite, an array on PostgreSQL) rather than one bound parameter each, which SQLAlchemy
    renders into the SQL text on every call.

    PostgreSQL: `IN (SELECT unnest(array))`, not `= ANY(array)`. Beside another condition on
    the same index (`job_id = 7 AND custom_id = ANY(…)`) the planner weighs `= ANY` by the
    table's statistics, which right after a job's load still say the job has a few hundred
    rows: it then reads every row of the job and filters, 100,000 rows for each 5,000 looked
    up (an export of 100,000: 2.3 s of the database's time, O(n²)). The rows of `unnest`
    are estimated from the array alone, so each value is looked up by the index."""
    return _among(conn, column, lambda kind: bindparam(None, listed(conn, values), type_=kind))


def among_bound(conn: Connection, column: ColumnElement[Any], key: str) -> ColumnElement[bool]:
    """`among`, its values given when the statement runs (`{key: listed(conn, values)}`)
    rather than held by it: for a statement built once and run for many sets of values. A
    statement SQLAlchemy builds sits in reference cycles, so one built per call keeps its
    values until the collector's next pass reaches it."""
    return _among(conn, column, lambda kind: bindparam(key, type_=kind))  # required: a run without it fails


def listed(conn: Connection, values: Sequence[Any]) -> Any:
    """`values` as `among` sends them: JSON text on SQLite, a list (an array) on PostgreSQL."""
    return fastjson.dumps(list(values)) if conn.dialect.name == "sqlite" else list(values)


def _among(conn: Connection, column: ColumnElement[Any], param: Callable[[TypeEngine], BindParameter]) -> ColumnElement[bool]:
    """`column IN` the values `param` (given the parameter's type) binds."""
    if conn.dialect.name == "sqlite":
        each = func.json_each(param(Text())).table_valued("value")
        return column.in_(select(each.c.value))
    return column.in_(select(func.unnest(param(postgresql.ARRAY(column.type)))))


def guard(conn: Connection, column: ColumnElement[Any], value: Any) -> ColumnElement[bool]:
    """`column = value`, for a statement run `by_key`: on PostgreSQL written `IS NOT DISTINCT
    FROM`, which the planner checks on each row found by key and never uses to find rows
    (the module doc says why). `value` is never NULL, so both mean the same; it is written
    into the SQL (`fixed`)."""
    if conn.dialect.name == "postgresql":
        return column.is_not_distinct_from(fixed(conn, value))
    return column == fixed(conn, value)


def fixed(conn: Connection, value: Any) -> ColumnElement[Any]:
    """`value` written into the SQL text instead of bound once per row: for what every row
    of an executemany shares (the job, the dispatch, the time), so that each row's dict
    holds, and the driver binds, only what differs. For numbers and lowtide's own names:
    text from a user's spec or a provider stays a bound parameter."""
    sql = literal(value).compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
    out = literal_column(str(sql))
    out.__dict__[FIXED] = value  # for COPY, which takes values, not SQL (store/copying.py)
    return out
