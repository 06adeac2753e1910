"""Executing one Core statement for many rows with the driver's own executemany.

SQLAlchemy's per-row parameter processing costs more than SQLite's insert itself at 100k
rows; for the few hot bulk statements (persisting requests, applying outcomes, recording
attempts) the statement is compiled once and the rows go straight to the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.sql import Executable, Insert


def executemany(conn: Connection, stmt: Executable, rows: Sequence[dict[str, Any]]) -> None:
    """Run `stmt` once per row. Rows give every bind parameter the statement does not fix."""
    if not rows:
        return
    # An INSERT without .values() names its columns from the rows (so ids stay automatic).
    keys = list(rows[0]) if isinstance(stmt, Insert) and not stmt._values else None
    compiled = stmt.compile(dialect=conn.dialect, column_keys=keys)
    fixed = compiled.params  # values written into the statement itself, e.g. state=...
    names = list(compiled.positiontup or ()) if compiled.positional else None
    if names is not None:
        own = [n in rows[0] for n in names]
        plan = list(zip(names, own, strict=True))
        params: list = [tuple(r[n] if mine else fixed[n] for n, mine in plan) for r in rows]
    else:
        constant = {k: v for k, v in fixed.items() if k not in rows[0]}
        params = [{**constant, **r} for r in rows] if constant else list(rows)
    conn.exec_driver_sql(str(compiled), params)
