"""A CSV source's column types are inferred by a pass that stops once every column is text
(a word among its cells): its kinds are the whole pass's, and it leaves what a pass in
progress noted (problems, the highest `since` value) as it was."""

from __future__ import annotations

import csv

import pyarrow as pa
import pytest

from lowtide.core.errors import SourceError
from lowtide.core.source_types import Inference
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
    ],
)
def test_kinds_of_csv_cells(cells, kind):
    inference = Inference(["c"], text=True)
    for cell in cells:
        inference.add({"c": cell})
    assert inference.kinds().get("c") == kind
    assert inference.settled == (kind == "string")


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
