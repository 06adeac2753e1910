"""A Parquet source: one file, a folder or a glob, read through pyarrow's datasets for its
schema, partitions and pushdown, and file by file, row group by row group for its rows
(core/sources.py has the other kinds and `source_at`, which opens this one)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lowtide.core.errors import SourceError
from lowtide.core.locations import BLOCK, Location
from lowtide.core.sources import (
    CHUNK_ROWS,
    Source,
    SourceRow,
    compare_values,
    holds,
    partitions_of,
    typed_like,
)


class ParquetSource(Source):
    """Parquet through pyarrow's datasets: one file, a folder or a glob, Hive partitions as
    columns, `source.filter` and `since` pushed down."""

    format = "parquet"

    def __init__(self, loc: Location, files: list[str]):
        super().__init__()
        self.loc = loc
        self.files = files
        self.label = loc.text
        self.name = loc.name_of(files[0]) if len(files) == 1 else loc.text
        self.dataset: Any = None  # opened once the filter and watermark are known (_check_known)

    def _open(self) -> None:
        """The dataset, with the schema of the LAST file the filter and watermark keep (in
        name order: the newest partition of a dated dataset, the one a nightly load reads),
        given to pyarrow rather than inferred from the first file: only that one footer is
        read up front, so partitions left out are never opened (the columns of the other
        kept files are added once their footers are read: `_check_schemas`)."""
        import pyarrow.parquet as pq

        loc, files = self.loc, self.files
        fs = loc.arrow_filesystem()
        kept = [f for f in files if self._keeps(f)]
        self.reference = (kept or files)[-1]
        try:  # a row is read as a dict: two columns of one name are refused by name, first
            physical = pq.read_schema(self.reference, filesystem=fs)
            self._check_columns(list(physical.names), "schema")
        except SourceError:
            raise
        except Exception as err:
            if len(files) == 1:
                raise SourceError(f"{loc.name_of(self.reference)}: cannot read as parquet ({_arrow_reason(err)})") from None
            raise SourceError(f"{loc.text}: partition {loc.name_of(self.reference)}: cannot read as parquet ({_arrow_reason(err)}); "
                              "replace the file, or leave it out (source.filter, source.path)") from None  # fmt: skip
        self._base = loc.base.rstrip("/") if len(files) > 1 or not loc.one_file else None
        self._keys = _partition_schema(loc, files) if self._base else None
        self._make_dataset(physical)

    def _make_dataset(self, physical) -> None:
        """The dataset of `physical`'s columns (a file's), and the partition columns."""
        import pyarrow as pa
        import pyarrow.dataset as ds

        keys = self._keys
        if keys is not None:
            physical = pa.schema([f for f in physical if f.name not in keys.names] + list(keys))
        try:
            self.dataset = ds.dataset(self.files, filesystem=self.loc.arrow_filesystem(), format="parquet", schema=physical,
                                      partitioning=ds.partitioning(keys, flavor="hive") if keys is not None else None,
                                      partition_base_dir=self._base)  # fmt: skip
        except Exception as err:
            raise SourceError(f"{self.loc.text}: cannot read as parquet ({_arrow_reason(err)})") from None
        self.columns = self._check_columns(list(self.dataset.schema.names), "schema")

    def _keeps(self, f: str) -> bool:
        """Whether the filter and watermark can keep rows of file `f`, judged by its
        partition folders alone (a condition on a data column keeps every file)."""
        parts = partitions_of(self.loc, f)
        items = list(self.filters) + ([(self.after.column, ">", self.after.value)] if self.after is not None else [])
        return all(holds(parts[c], op, typed_like(w, parts[c]) if op not in ("in", "not in") else [typed_like(x, parts[c]) for x in w])
                   for c, op, w in items if c in parts)  # fmt: skip

    def _check_known(self) -> None:
        self._open()
        super()._check_known()
        self._check_schemas()  # once the filter is known: the partitions it leaves out stay unopened

    def _check_schemas(self) -> None:
        """Every file's columns must have the types the dataset has (the reference file's,
        or for a column it lacks the first file's that has it): a partition written with
        another type is refused before any row is read. A column some files lack is a
        column of every row, null where its file has none: one an older partition has and
        the newest dropped is kept too. Only the files the filter's partition columns keep
        are opened."""
        import pyarrow as pa

        schema = self.dataset.schema
        added: list[tuple[Any, str]] = []  # (field, the file it was first met in): columns the reference lacks
        for fragment in self.dataset.get_fragments(filter=self.expression()):
            try:
                own = fragment.physical_schema
            except Exception as err:
                raise SourceError(f"{self.label}: partition {self.loc.name_of(fragment.path)}: cannot read as parquet "
                                  f"({_arrow_reason(err)}); replace the file, or leave it out (source.filter, source.path)") from None  # fmt: skip
            for field in own:
                i = schema.get_field_index(field.name)
                if i >= 0:
                    known, where = schema.field(i), self.reference
                else:
                    met = next((a for a in added if a[0].name == field.name), None)
                    if met is None:
                        added.append((field, fragment.path))
                        continue
                    known, where = met
                if not _same_type(known.type, field.type):
                    raise SourceError(
                        f'{self.label}: partition {self.loc.name_of(fragment.path)}: column "{field.name}" is {field.type} there, '
                        f"{known.type} in {self.loc.name_of(where)}; write every "
                        "partition with the same types, or leave the odd one out (a source.filter on its partition column, or source.path)"
                    )
        if added:
            keys = self._keys.names if self._keys is not None else []
            data = [f for f in schema if f.name not in keys]
            self._make_dataset(pa.schema(data + [f for f, _ in added]))

    def expression(self):
        """The filter and watermark as one pyarrow expression (None for all rows)."""
        import pyarrow as pa
        import pyarrow.dataset as ds

        out = None
        items = list(self.filters) + ([(self.after.column, ">", self.after.value)] if self.after is not None else [])
        for column, op, value in items:
            kind = self.dataset.schema.field(column).type
            field = ds.field(column)
            if op in ("in", "not in"):
                values = pa.array([_scalar(v, kind) for v in value], type=kind)
                e = field.isin(values)
                e = ~e if op == "not in" else e
            else:
                v = pa.scalar(_scalar(value, kind), type=kind)
                e = {"=": field == v, "==": field == v, "!=": field != v, "<": field < v, "<=": field <= v, ">": field > v, ">=": field >= v}[op]
            out = e if out is None else out & e
        return out

    def _rows(self, size: int) -> Iterator[SourceRow]:
        number = 0
        try:
            for table in self._tables(size):
                for values in table.to_pylist():
                    number += 1
                    yield SourceRow(number, None, values)
        except SourceError:
            raise
        except Exception as err:
            raise SourceError(f"{self.label}: cannot read as parquet ({_arrow_reason(err)})") from None

    def _tables(self, size: int, columns: list[str] | None = None) -> Iterator[Any]:
        """The rows the filter and watermark keep, at most `size` per table, file by file and
        row group by row group. Not the dataset scanner: it decodes whole row groups ahead of
        the reader whatever its read-ahead settings (~100 MB at a million-row source's row
        groups); one file's batches, unbuffered, stay a few MB."""
        import pyarrow as pa
        import pyarrow.dataset as ds
        import pyarrow.parquet as pq

        expr = self.expression()
        schema = self.dataset.schema if columns is None else pa.schema([self.dataset.schema.field(c) for c in columns])
        for fragment in self.dataset.get_fragments(filter=expr):
            keys = ds.get_partition_keys(fragment.partition_expression) or {}
            # row groups whose statistics the filter rules out are never read
            groups = None if expr is None else [piece.row_groups[0].id for piece in fragment.split_by_row_group(filter=expr, schema=self.dataset.schema)]
            if groups == []:
                continue
            with self._open_file(fragment.path) as f:
                pf = pq.ParquetFile(f, pre_buffer=False)
                own = set(pf.schema_arrow.names)
                needed = set(schema.names) | ({c for c, _, _ in self.filters} | ({self.after.column} if self.after else set()))
                wanted = [c for c in pf.schema_arrow.names if c in needed and c not in keys]
                for batch in pf.iter_batches(batch_size=size, row_groups=groups, columns=wanted, use_threads=False):
                    n = batch.num_rows
                    arrays = {}
                    for field in self.dataset.schema:
                        if field.name in keys:
                            arrays[field.name] = pa.array([keys[field.name]] * n, type=field.type)
                        elif field.name in own and field.name in needed:
                            arrays[field.name] = batch.column(field.name)
                        elif field.name in needed:  # a column this file has not: null here
                            arrays[field.name] = pa.nulls(n, field.type)
                    table = pa.table(arrays)
                    if expr is not None:
                        table = table.filter(expr)
                    yield table.select(schema.names)

    def _open_file(self, path: str):
        if self.loc.local:
            import pyarrow as pa

            return pa.OSFile(path, "rb")
        # a small read-ahead block: fsspec's default (S3: 50 MB) would be held per open file
        return self.loc.fs.open(path, "rb", block_size=BLOCK)

    def highest_of(self, column: str) -> Any:
        import pyarrow.compute as pc

        after, self.after = self.after, None
        try:
            highest = None
            for table in self._tables(CHUNK_ROWS * 10, columns=[column]):
                top = pc.max(table.column(0)).as_py()
                if top is not None and (highest is None or compare_values(top, highest) > 0):
                    highest = top
            return highest
        finally:
            self.after = after

    def arrow_types(self, columns: list[str]) -> dict[str, Any]:
        schema = self.dataset.schema
        return {c: schema.field(c).type for c in columns if schema.get_field_index(c) >= 0}


def _partition_schema(loc: Location, files: list[str]):
    """The Hive partition columns of `files`, typed from the folder names alone as pyarrow
    infers them (all digits: int32; else text), so no file is opened to learn them."""
    import pyarrow as pa

    values: dict[str, set[str]] = {}
    for f in files:
        for key, value in partitions_of(loc, f).items():
            values.setdefault(key, set()).add(value)
    return pa.schema([pa.field(k, pa.int32() if all(v.lstrip("-").isdigit() for v in vs) else pa.string()) for k, vs in values.items()])


def _same_type(a, b) -> bool:
    """Types that read the same: a dictionary column and its values' type are one."""
    import pyarrow as pa

    a = a.value_type if pa.types.is_dictionary(a) else a
    b = b.value_type if pa.types.is_dictionary(b) else b
    return a == b or (pa.types.is_string(a) or pa.types.is_large_string(a)) and (pa.types.is_string(b) or pa.types.is_large_string(b))


def _scalar(value: Any, kind) -> Any:
    """A spec's or the store's value as a Python value of the column's Arrow type."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    try:
        return pa.scalar(value).cast(kind).as_py()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        try:
            return pa.scalar(str(value.isoformat() if hasattr(value, "isoformat") else value)).cast(kind).as_py()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            raise SourceError(f"{value!r} cannot be compared with a column of type {kind}; give a value of that type") from None


def _arrow_reason(err: Exception) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text[:300]
