"""A CSV source read night after night with `source.since`: a night with nothing new stores
nothing, and a column that went backwards is refused, whether the watermark's rows were read in
the load's own pass (one file: every row is read anyway) or its partitions were left unopened."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lowtide.core import source_types
from lowtide.core.errors import SourceError
from lowtide.core.sources import _number
from lowtide.engine.loader import load_job
from tests.conftest import make_spec


def spec_for(path, **source):
    return make_spec(path, source={"id_column": "ticket_id", "since": {"column": "ticket_id"}, **source},
                     template={"user": "{{ body }}"})  # fmt: skip


def write(path, ids: list[str], extra: str = "") -> None:
    path.write_text("ticket_id,body,team\n" + "".join(f"{i},ticket {i},{'b' if i == extra else 'a'}\n" for i in ids), encoding="utf-8")


def test_one_file_nothing_new_then_backwards(sqlite_store, clock, tmp_path):
    source = tmp_path / "tickets.csv"
    write(source, ["t0001", "t0002", "t0003"])
    spec = spec_for(source)
    assert (load_job(sqlite_store, spec, clock).new, load_job(sqlite_store, spec, clock).new) == (3, 0)  # nothing new
    write(source, ["t0001", "t0002", "t0003", "t0004"])
    report = load_job(sqlite_store, spec, clock)
    assert (report.new, report.watermark) == (1, "t0004")
    write(source, ["t0001", "t0002"])  # rebuilt from an older snapshot
    with pytest.raises(SourceError, match='source.since column "ticket_id" went backwards: its highest value is now t0002'):
        load_job(sqlite_store, spec, clock)


def test_the_highest_is_of_the_rows_the_filter_keeps(sqlite_store, clock, tmp_path):
    source = tmp_path / "tickets.csv"
    write(source, ["t0001", "t0002"])
    spec = spec_for(source, filter=[["team", "=", "a"]])
    assert load_job(sqlite_store, spec, clock).watermark == "t0002"
    write(source, ["t0001", "t0009"], extra="t0009")  # t0009 is another team's: the filter leaves it out
    with pytest.raises(SourceError, match="went backwards: its highest value is now t0001"):
        load_job(sqlite_store, spec, clock)


def test_partitions_left_unopened_are_still_told(sqlite_store, clock, tmp_path):
    root = tmp_path / "tickets"
    for day, ids in (("2026-12-01", ["t0001"]), ("2026-12-02", ["t0002"])):
        (root / f"dt={day}").mkdir(parents=True)
        write(root / f"dt={day}" / "a.csv", ids)
    spec = spec_for(root, since={"column": "dt"})
    assert load_job(sqlite_store, spec, clock).new == 2
    assert load_job(sqlite_store, spec, clock).new == 0  # both days below the watermark: neither is opened
    (root / "dt=2026-12-02" / "a.csv").unlink()
    (root / "dt=2026-12-02").rmdir()
    with pytest.raises(SourceError, match='"dt" went backwards: its highest value is now 2026-12-01'):
        load_job(sqlite_store, spec, clock)


def reference_number(text: str) -> int | float | None:
    """What `_number` answers, as its doc says: a whole number's text an int, another finite
    number's a float, anything else None."""
    text = text.strip()
    if source_types.INT_TEXT.match(text):
        return int(text)
    try:
        number = float(text)
    except ValueError:
        return None
    return number if number == number and abs(number) != float("inf") else None


@given(st.one_of(st.text(max_size=12), st.from_regex(r"\s*[+-]?(\d+|inf|nan|infinity|\d*\.\d+(e[+-]?\d+)?)\s*", fullmatch=True),
                 st.sampled_from(["t0001", "Infinity", "NaN", "-inf", "1_000", "١٢", "e5", ".5", " 7 ", "2026-12-03"])))  # fmt: skip
def test_a_cell_spells_a_number_as_float_reads_it(text):
    assert repr(_number(text)) == repr(reference_number(text))
