"""An eval's long table (`lowtide results EVAL --out URL`) written to an object store (moto's
S3 server on loopback), from a real eval on the echo route: the local export's bytes, whole,
with no temporary key behind, and a second export changes nothing."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from lowtide.engine.eval_export import export_eval_results
from lowtide.store.db import Store
from tests.conftest import ticket_rows, write_csv
from tests.engine.test_evals import run, spec


@pytest.fixture
def evaluated(tmp_path, clock, monkeypatch):
    """A finished eval of two prompt variants over 6 tickets (echo answers the first choice
    its message names: `right` is always right, `wrong` says technical)."""
    monkeypatch.chdir(tmp_path)
    source = write_csv(tmp_path / "t.csv", ticket_rows(6))
    store = Store(str(tmp_path / "lowtide.db"))
    ev, _, statuses = run(store, clock, spec(source))
    assert [s.counts for s in statuses] == [{"succeeded": 6}, {"succeeded": 6}]
    yield store, ev
    store.close()


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_an_evals_results_to_s3_are_the_local_exports_bytes(s3, evaluated, tmp_path, fmt):
    store, ev = evaluated
    url = s3.bucket("evals")
    local = export_eval_results(store, ev, tmp_path / f"local.{fmt}")
    report = export_eval_results(store, ev, f"{url}/ev/results.{fmt}")
    assert (report.path, report.rows, report.states) == (f"{url}/ev/results.{fmt}", 12, {"succeeded": 12})
    first = s3.fs().cat(f"evals/ev/results.{fmt}")
    assert first == (tmp_path / f"local.{fmt}").read_bytes() and local.rows == 12
    again = export_eval_results(store, ev, f"{url}/ev/results.{fmt}")
    assert again.rows == 12 and s3.fs().cat(f"evals/ev/results.{fmt}") == first
    fs = s3.fs()
    fs.invalidate_cache()
    assert fs.find("evals") == [f"evals/ev/results.{fmt}"]  # no temporary key left


def test_the_long_table_in_s3_has_every_variant_and_verdict(s3, evaluated, tmp_path):
    store, ev = evaluated
    url = s3.bucket("evals")
    export_eval_results(store, ev, f"{url}/results.parquet")
    with s3.fs().open("evals/results.parquet", "rb") as f:
        rows = pq.read_table(f).to_pylist()
    verdicts = {(r["ticket_id"], r["variant"]): r["correct"] for r in rows}
    tickets = [r["ticket_id"] for r in ticket_rows(6)]
    technical = {r["ticket_id"] for r in ticket_rows(6) if r["gold"] == "technical"}
    assert verdicts == {(t, "e-right"): True for t in tickets} | {(t, "e-wrong"): t in technical for t in tickets}
