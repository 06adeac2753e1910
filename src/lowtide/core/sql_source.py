"""A SQL table or query as a source: `source.url` (an SQLAlchemy URL) with `table` or `query`.

Rows are streamed with a server-side cursor (`stream_results`), so a table of millions is
read a chunk at a time; `source.filter` and `since` become the query's WHERE clause. The URL
holds no password (the spec refuses one): the driver's own chain supplies it (PGPASSWORD,
~/.pgpass, a service file).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from lowtide.core import source_types
from lowtide.core.errors import SourceError
from lowtide.core.sources import (  # sources.py imports this module only when a spec asks for SQL
    Source,
    SourceRow,
)
from lowtide.core.spec import SourceSpec
from lowtide.core.sql_urls import shown_url


class SqlSource(Source):
    format = "sql"

    def __init__(self, spec: SourceSpec):
        super().__init__()
        self.spec = spec
        self.url = sa.engine.make_url(spec.url)
        shown = shown_url(self.url)
        self.name = spec.table or "query"
        self.label = f"{shown} table {spec.table}" if spec.table else f"{shown} query"
        try:
            self.engine = sa.create_engine(self.url)
        except Exception as err:  # an unknown dialect or a driver not installed
            raise SourceError(f"{self.label}: cannot connect ({_reason(err)}); install the database's driver "
                              "(for PostgreSQL: pip install 'lowtide[postgres]')") from None  # fmt: skip
        self.selectable = self._selectable()
        self.columns = self._check_columns(list(self.selectable.selected_columns.keys()), "columns")

    def _selectable(self) -> sa.Select:
        try:
            with self.engine.connect() as conn:
                if self.spec.table is not None:
                    schema, _, name = self.spec.table.rpartition(".")
                    if not sa.inspect(conn).has_table(name, schema=schema or None):
                        raise SourceError(f"{self.label}: no such table; check source.table (a schema's table as schema.table)")
                    table = sa.Table(name, sa.MetaData(), schema=schema or None, autoload_with=conn)
                    return sa.select(table)
                query = sa.text(self.spec.query)
                names = list(conn.execute(sa.select(sa.text("*")).select_from(query.columns().subquery("q")).where(sa.false())).keys())
                return sa.select(*[sa.column(n) for n in names]).select_from(query.columns().subquery("q"))
        except SourceError:
            raise
        except Exception as err:
            raise SourceError(f"{self.label}: {_reason(err)}") from None

    def _where(self, stmt: sa.Select) -> sa.Select:
        cols = stmt.selected_columns
        for column, op, value in self.filters:
            c = cols[column]
            stmt = stmt.where(
                {"=": c == value, "==": c == value, "!=": c != value, "<": c < value, "<=": c <= value, ">": c > value,
                 ">=": c >= value, "in": c.in_(value) if op == "in" else None, "not in": c.not_in(value) if op == "not in" else None}[op]
            )  # fmt: skip
        if self.after is not None:
            stmt = stmt.where(cols[self.after.column] > self.after.value)
        return stmt

    def _rows(self, size: int) -> Iterator[SourceRow]:
        number = 0
        stmt = self._where(self.selectable)
        try:
            with self.engine.connect() as conn:
                result = conn.execution_options(stream_results=True, yield_per=size).execute(stmt)
                for part in result.mappings().partitions():
                    for values in part:
                        number += 1
                        yield SourceRow(number, None, dict(values))
        except SourceError:
            raise
        except Exception as err:
            raise SourceError(f"{self.label}: {_reason(err)}") from None

    def highest_of(self, column: str) -> Any:
        after, self.after = self.after, None
        try:
            stmt = self._where(self.selectable).subquery("rows")
            with self.engine.connect() as conn:
                return conn.execute(sa.select(sa.func.max(stmt.c[column]))).scalar()
        except Exception as err:
            raise SourceError(f"{self.label}: {_reason(err)}") from None
        finally:
            self.after = after

    def arrow_types(self, columns: list[str]) -> dict[str, Any]:
        """The table's own column types; a query's are inferred from its values."""
        known: dict[str, Any] = {}
        for c in self.selectable.selected_columns:
            kind = _arrow_of(c.type)
            if kind is not None and c.name in columns:
                known[c.name] = kind
        rest = [c for c in columns if c not in known and c not in self.types]
        if rest:
            inference = source_types.Inference(rest, text=False)
            for chunk in self.chunks(strict=False):
                for row in chunk:
                    inference.add(row.values)
            known.update({c: source_types.arrow_type(k) for c, k in inference.kinds().items()})
        known.update({c: source_types.arrow_type(k) for c, k in self.types.items()})
        return known


def _arrow_of(kind: sa.types.TypeEngine) -> Any:
    import pyarrow as pa

    if isinstance(kind, sa.Boolean):
        return pa.bool_()
    if isinstance(kind, sa.Integer):
        return pa.int64()
    if isinstance(kind, sa.Float):
        return pa.float64()
    if isinstance(kind, sa.Numeric):
        return pa.float64() if kind.scale in (None, 0) and kind.precision is None else pa.decimal128(kind.precision or 38, kind.scale or 0)
    if isinstance(kind, sa.DateTime):
        return pa.timestamp("us", tz="UTC") if kind.timezone else pa.timestamp("us")
    if isinstance(kind, sa.Date):
        return pa.date32()
    if isinstance(kind, sa.String | sa.Text | sa.Enum):
        return pa.string()
    return None


def _reason(err: Exception) -> str:
    """The driver's own first line, with any password in a URL hidden."""
    from lowtide.core.locations import redact

    orig = getattr(err, "orig", None) or err
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return redact(text)[:400]
