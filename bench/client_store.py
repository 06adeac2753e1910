"""Where a bench's client store lives: a SQLite file in its folder, or a fresh PostgreSQL
schema, dropped afterwards. Apart from killtest.py, so that a bench that needs only this
imports only SQLAlchemy (killtest imports httpx, whose import brings its CLI's rich and click)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import sqlalchemy as sa


class ClientStore:
    """Where one trial's client store lives: a SQLite file, or a fresh PostgreSQL schema."""

    def __init__(self, folder: Path, pg_base: str | None):
        self.pg_base = pg_base
        self.sqlite_path: Path | None = None
        if pg_base:
            self.schema = f"killtest_{uuid.uuid4().hex[:12]}"
            admin = sa.create_engine(_pg_driver(pg_base), isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE SCHEMA "{self.schema}"'))
            admin.dispose()
            sep = "&" if "?" in pg_base else "?"
            self.url = f"{pg_base}{sep}options=-csearch_path%3D{self.schema}"
        else:
            self.sqlite_path = folder / "lowtide.db"
            self.url = str(self.sqlite_path)

    def engine(self) -> sa.Engine:
        if self.sqlite_path:
            return sa.create_engine(f"sqlite:///{self.sqlite_path}")
        return sa.create_engine(_pg_driver(self.url))

    def opened_by(self, pid: int) -> bool:
        """Whether process `pid` has the store open (SQLite); PostgreSQL: always."""
        if self.sqlite_path is None:
            return True
        target = str(self.sqlite_path)
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return True
                except OSError:
                    continue
        except OSError:
            return False
        return False

    def drop(self) -> None:
        if self.pg_base:
            admin = sa.create_engine(_pg_driver(self.pg_base), isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'))
            admin.dispose()


def _pg_driver(url: str) -> str:
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain):]
    return url
