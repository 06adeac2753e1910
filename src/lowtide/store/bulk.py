"""Executing one Core statement for many rows with the driver's own executemany.

SQLAlchemy's per-row parameter processing costs more than SQLite's insert itself at 100k
rows; for the few hot bulk statements (persisting requests, applying outcomes, recording
attempts) the statement is compiled once, with positional parameters, and each row's dict
goes to the driver as a tuple in the statement's order: drivers bind a tuple by position,
cheaper than looking every name up in a dict (sqlite3 asks SQLite for each parameter's name,
per row).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Dialect,
    any_,
    bindparam,
    func,
    literal,
    literal_column,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import Executable, Insert

from lowtide.core import fastjson

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


def executemany(conn: Connection, stmt: Executable, rows: Sequence[dict[str, Any]]) -> None:
    """Run `stmt` once per row. Rows give every bind parameter the statement does not fix."""
    if not rows:
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


def among(conn: Connection, column: ColumnElement[Any], values: Sequence[Any]) -> ColumnElement[bool]:
    """`column IN values` for thousands of values, sent as one parameter (a JSON array on
    SQLite, an array on PostgreSQL) rather than one bound parameter each, which SQLAlchemy
    renders into the SQL text on every call."""
    if conn.dialect.name == "sqlite":
        listed = func.json_each(fastjson.dumps(list(values))).table_valued("value")
        return column.in_(select(listed.c.value))
    return column == any_(bindparam(None, list(values), type_=postgresql.ARRAY(column.type)))


def fixed(conn: Connection, value: Any) -> ColumnElement[Any]:
    """`value` written into the SQL text instead of bound once per row: for what every row
    of an executemany shares (the job, the dispatch, the time), so that each row's dict
    holds, and the driver binds, only what differs. For numbers and lowtide's own names:
    text from a user's spec or a provider stays a bound parameter."""
    sql = literal(value).compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
    return literal_column(str(sql))
