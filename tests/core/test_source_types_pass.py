"""A CSV source's column types are inferred by a pass that stops once every column is text
(a word among its cells): its kinds are the whole pass's, and it leaves what a pass in
progress noted (problems, the highest `since` value) as it was."""

from __future__ import annotations

import csv

import pyarrow as pa
import pytest

from lowtide.core.errors import SourceError
from lowtide.core.source_types import Inference, convert, problem
from lowtide.core.sources import INFER_ROWS, open_file


def _csv(path, rows: list[list[str]], header=("id", "n", "x", "flag", "word")):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_each_kind_is_the_whole_pass_s_where_a_late_cell_changes_it(tmp_path):
    """Cells past the first rows decide: a word in a late row makes its column text; a
    number column stays a number however long it is."""
    rows = [[f"r{i}", str(i), f"{i}.5", "true" if i % 2 else "FALSE", str(i)] for i in range(6 * INFER_ROWS)]
    rows[5 * INFER_ROWS][4] = "many"  # a word among numbers, late
    rows[5 * INFER_ROWS + 1][1] = ""  # an empty cell is no kind
    source = open_file(_csv(tmp_path / "t.csv", rows))
    kinds = source.arrow_types(["id", "n", "x", "flag", "word"])
    assert kinds == {"id": pa.string(), "n": pa.int64(), "x": pa.float64(), "flag": pa.bool_(), "word": pa.string()}


@pytest.mark.parametrize(
    ("cells", "kind"),
    [
        (["1", "2.5"], "float"),  # integers among numbers
        (["1", "x"], "string"),
        (["x", "1"], "string"),
        (["true", "1"], "string"),  # a flag among numbers: text, as the doc says of anything else
        (["01234", "5"], "string"),  # a leading zero is text
        (["", " "], None),  # no value: left to the default (text)
        (["TRUE", "false"], "bool"),
        (["1e5", ".5", "-3."], "float"),
        # What Python's int() and float() take, and a CSV cell does not write as a number:
        # text, not a number a typed result would rewrite (123, 1000.0, inf).
        (["١٢٣", "45"], "string"),  # Arabic-Indic digits
        (["１２", "3"], "string"),  # full-width digits
        (["1_000", "2"], "string"),
        (["1e400", "2.5"], "string"),  # past a float: inf
    ],
)
def test_kinds_of_csv_cells(cells, kind):
    inference = Inference(["c"], text=True)
    for cell in cells:
        inference.add({"c": cell})
    assert inference.kinds().get("c") == kind
    assert inference.settled == (kind == "string")


@pytest.mark.parametrize(
    ("cell", "kind", "why"),
    [("١٢٣", "int", "not an integer"), ("1_000", "int", "not an integer"), ("１２", "float", "not a number"),
     ("1_000.5", "float", "not a number"), ("1e400", "float", "past a 64-bit float"), ("1e400", "int", "past a 64-bit float")],
)  # fmt: skip
def test_a_declared_number_is_written_in_ascii_digits(cell, kind, why):
    """`source.types` checks each value of a declared column as its kind: the same spellings
    are refused, by name, rather than stored as another number."""
    assert problem(cell, kind) == why


@pytest.mark.parametrize(("cell", "kind", "value"), [(" 12 ", "int", 12), ("3.0", "int", 3), ("-1.5e3", "float", -1500.0), ("NaN", "float", None)])
def test_declared_numbers_as_written(cell, kind, value):
    got = convert(cell, kind)
    assert got == value or (value is None and got != got)  # NaN, as a declared float column may hold


def test_the_pass_leaves_a_pass_in_progress_as_it_was(tmp_path):
    """The export infers the types while its own pass over the source is under way: a
    problem row past the first chunk was listed twice (the inferring pass listed every
    problem, then the export's own pass listed it again)."""
    rows = [[f"r{i}", str(i), "1.5", "true", "w"] for i in range(6000)]
    path = _csv(tmp_path / "t.csv", rows)
    with path.open("a") as f:
        f.write("r-bad,1,2\n")  # too few fields, in the second chunk
    source = open_file(path)
    chunks = source.chunks()
    next(chunks)  # the first chunk: no problem yet
    assert source.arrow_types(["id", "n", "x", "flag", "word"])["n"] == pa.int64()
    assert source.problems == []
    with pytest.raises(SourceError) as err:
        list(chunks)
    assert str(err.value).count("has 3 fields") == 1, str(err.value)
