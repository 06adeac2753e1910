"""examples/nightly: "tag what came in today, every night" as one spec and one cron line.
Run as cron runs it (`lowtide run`, a new process each night) on a copy of the example with
the echo route in place of the embedded model: each night reads only the days past the last
one stored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.cli.test_cli import LOWTIDE, Cli

EXAMPLE = Path(__file__).parents[2] / "examples" / "nightly"

pytestmark = pytest.mark.skipif(not LOWTIDE.exists(), reason=f"no lowtide script at {LOWTIDE}")


def test_each_night_reads_only_the_new_days(tmp_path):
    folder = tmp_path / "nightly"
    shutil.copytree(EXAMPLE, folder)
    spec = folder / "tag-new-tickets.yaml"
    spec.write_text(spec.read_text().replace("route: local", "route: echo"), encoding="utf-8")
    cli = Cli(folder, str(tmp_path / "lowtide.db"))

    code, out = cli("run", "tag-new-tickets.yaml")
    assert code == 0, out
    assert "7 new, 0 already stored" in out
    assert "dt 2026-12-02" in out  # the watermark it keeps

    code, out = cli("run", "tag-new-tickets.yaml")  # the same night again: nothing to do
    assert code == 0, out
    assert "0 new" in out

    day3 = folder / "tickets" / "dt=2026-12-03"
    day3.mkdir()
    (day3 / "tickets.csv").write_text("ticket_id,channel,body\nN-1008,chat,Where is my order?\nN-1009,email,Love the new export!\n")
    code, out = cli("estimate", "tag-new-tickets.yaml", "--json")  # priced as the next run reads it
    assert code == 0, out
    assert json.loads(out)["rows"] == 2
    code, out = cli("run", "tag-new-tickets.yaml")
    assert code == 0, out
    assert "2 new, 0 already stored" in out and "dt 2026-12-03" in out

    rows = pq.read_table(folder / "results" / "tagged-tickets.parquet").to_pylist()
    assert len(rows) == 9 and {r["state"] for r in rows} == {"succeeded"}
    assert {r["dt"] for r in rows} == {"2026-12-01", "2026-12-02", "2026-12-03"}
