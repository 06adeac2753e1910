"""Executing one Core statement for many rows with the driver's own executemany.

SQLAlchemy's per-row parameter processing costs more than SQLite's insert itself at 100k
rows; for the few hot bulk statements (persisting requests, applying outcomes, recording
attempts) the statement is compiled once, with named parameters, and the rows go straight to
the driver as dicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
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

_SQLITE_NAMED = sqlite.dialect(paramstyle="named")


def executemany(conn: Connection, stmt: Executable, rows: Sequence[dict[str, Any]]) -> None:
    """Run `stmt` once per row. Rows give every bind parameter the statement does not fix."""
    if not rows:
        return
    # An INSERT without .values() names its columns from the rows (so ids stay automatic).
    keys = list(rows[0]) if isinstance(stmt, Insert) and not stmt._values else None
    dialect = _SQLITE_NAMED if conn.dialect.name == "sqlite" else conn.dialect
    compiled = stmt.compile(dialect=dialect, column_keys=keys)
    if compiled.positional:
        raise ValueError(f"bulk.executemany needs a named paramstyle, not {dialect.paramstyle}")
    # Values the statement itself fixes (e.g. state = 'dispatched' in a WHERE).
    constant = {k: v for k, v in compiled.params.items() if k not in rows[0]}
    params = [{**constant, **r} for r in rows] if constant else list(rows)
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
