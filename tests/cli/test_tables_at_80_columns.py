"""Every table-printing command at 80 columns and in a pipe: figures whole, never cut with
"…"; and each command's `--json` in its documented shape (docs/cli.md)."""

from __future__ import annotations

import io
import json
from decimal import Decimal

from rich.console import Console

from lowtide.cli.display import status_json, status_table
from lowtide.cli.tables import Col, fitted_table
from lowtide.engine.control import JobStatus
from lowtide.engine.progress import Eta, JobProgress
from tests.cli.test_cli import LABELS, Cli, write_job

BIG = JobStatus(
    name="eval-summaries-2025-11-30-very-long-name", state="active", route="openai-batch",
    counts={"succeeded": 88_412, "failed": 1_207, "pending": 50_000, "dispatched": 160_381},
    phases={"in_progress": 12, "finalizing": 3}, spent_usd=Decimal("12345.67"), unknown_costs=17,
    budget_usd=Decimal("20000"), dispatched={"submitted": 150_381, "planned": 10_000},
    dispatches={"ended": 40, "submitted": 15, "planned": 1},
)  # fmt: skip
OTHER = JobStatus(name="eval-summaries-2025-11-30-other", state="finished", route="echo", counts={"succeeded": 100_000})


def render(renderable, width: int = 80) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)  # a pipe: not a terminal
    console.print(renderable)
    return console.file.getvalue()


def test_status_at_80_columns_keeps_every_figure_whole_and_tells_two_jobs_apart():
    text = render(status_table([BIG, OTHER], Console(width=80)))
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    # An amount may wrap between its words; no figure is ever split.
    for figure in ("300,000", "88,412", "1,207", "150,381", "$12,345.67", "$20,000.00", "100,000"):
        assert _whole_in_a_cell(text, figure), figure
    # Two long names that start alike are both readable (folded, not cut).
    first_column = "".join(line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│"))
    assert first_column == BIG.name + OTHER.name


def _whole_in_a_cell(text: str, figure: str) -> bool:
    """A figure cell is never wrapped, so the figure is on one line."""
    return any(figure in line for line in text.splitlines())


def test_in_flight_counts_only_what_was_sent_and_queued_the_rest():
    assert BIG.in_flight == 150_381
    assert BIG.queued == 50_000 + 10_000
    shape = status_json(BIG)
    assert (shape["in_flight"], shape["queued"], shape["total"]) == (150_381, 60_000, 300_000)


def test_a_table_too_wide_leaves_out_the_least_useful_columns_and_names_them():
    cols = [Col("name"), *(Col(f"figure {i}", figure=True, drop=i) for i in range(1, 9))]
    rows = [["x", *(f"{10**9 + i:,}" for i in range(1, 9))]]
    text = render(fitted_table(Console(width=80), cols, rows))
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert "not shown at 80 columns: figure 5, figure 6, figure 7, figure 8" in " ".join(text.split())
    for kept in range(1, 5):  # the most useful are kept, whole
        assert f"1,000,000,00{kept}" in text


def test_plain_progress_lines_off_a_tty_name_phase_apart_from_counts_with_an_eta():
    clock = iter([0.0, 0.0, 10.0, 10.0]).__next__
    console = Console(file=io.StringIO(), width=80, color_system=None)
    assert not console.is_terminal
    with JobProgress(console, "run eval", every=0, now=clock) as progress:
        progress.update(BIG)
        progress.update(JobStatus(**{**_fields(BIG), "counts": {**BIG.counts, "succeeded": 98_412, "pending": 40_000}}))
    lines = console.file.getvalue().splitlines()
    assert lines[0].startswith("run eval: 89,619 of 300,000 done (88,412 ok, 1,207 failed), 150,381 in flight, 60,000 queued")
    assert "batches 40 of 56 done (3 finalizing, 12 in_progress)" in lines[0]
    # 10,000 more done in 10 s: 200,381 left at 1,000/s, 200 s.
    assert lines[1].endswith("; ETA 3 min"), lines[1]


def _fields(s: JobStatus) -> dict:
    return {f: getattr(s, f) for f in s.__slots__}


def test_eta_needs_two_measurements():
    now = iter([0.0, 30.0]).__next__
    eta = Eta(now)
    assert eta(0, 100) == ""
    assert eta(50, 100) == "ETA 30 s"


def test_every_table_command_at_80_columns_in_a_pipe_and_its_json(tmp_path):
    cli = Cli(tmp_path, str(tmp_path / "lowtide.db"))
    cli.env["COLUMNS"] = "80"
    write_job(tmp_path, rows=1234, output={"path": "out/results.csv"})
    code, out = cli("run", "job.yaml")
    assert code == 0, out
    runs = {
        "status": ("status",), "status-job": ("status", "tickets"), "report": ("report",),
        "report-by": ("report", "--by", "route"), "estimate": ("estimate", "job.yaml"),
        "compare": ("results", "tickets", "--out", "r.csv", "--compare", "gold"), "cancel": ("cancel", "tickets"),
        "routes": ("routes",), "routes-one": ("routes", "openai-batch"),
    }  # fmt: skip
    outputs = dict(zip(runs, cli.many(*runs.values()), strict=True))
    for name, (code, text) in outputs.items():
        assert code == 0, (name, text)
        assert "…" not in text, (name, text)
        assert max(len(line) for line in text.splitlines()) <= 80, (name, text)
    assert "1,234" in outputs["status"][1] and "1,234" in outputs["status-job"][1]
    assert "1,234" in outputs["compare"][1]  # the `all` row of the accuracy table
    assert "1,234 rows" in outputs["estimate"][1]
    assert "nothing to cancel: tickets is finished" in outputs["cancel"][1]

    shapes = dict(zip(runs, cli.many(*(args + ("--json",) for args in runs.values())), strict=True))
    status = json.loads(shapes["status"][1])
    assert [j["job"] for j in status["jobs"]] == ["tickets"]
    one = json.loads(shapes["status-job"][1])
    assert set(one) == {
        "job", "state", "route", "total", "requests", "queued", "in_flight", "batches", "failures", "tokens",
        "spent_usd", "unknown_costs", "budget_usd", "reserved_usd", "placement", "tiers", "events", "notifications", "done",
    }  # fmt: skip
    assert one["total"] == 1234 and one["requests"]["succeeded"] == 1234 and one["in_flight"] == 0
    assert json.loads(shapes["report"][1])["total"]["attempts"] == 1234
    assert json.loads(shapes["estimate"][1])["rows"] == 1234
    compare = json.loads(shapes["compare"][1][shapes["compare"][1].index("{"):])
    assert compare["rows"] == 1234 and compare["accuracy"]["rows"] == 1234
    assert compare["accuracy"]["chance"] == 1 / len(LABELS)
    assert json.loads(shapes["cancel"][1])["cancelled_now"] == 0
    assert "openai-batch" in json.loads(shapes["routes"][1])
    assert json.loads(shapes["routes-one"][1])["limits"]["max_requests"] == 50_000


def test_a_notebook_gets_plain_lines_not_a_live_widget_and_a_run_from_python_ends_with_a_summary():
    # In Jupyter, Rich's live display wants ipywidgets: a warning and an empty box in every cell.
    assert not JobProgress(Console(file=io.StringIO(), force_jupyter=True), "run eval").live
    console = Console(file=io.StringIO(), width=80, color_system=None)
    done = JobStatus(name="tickets", state="finished", route="echo", counts={"succeeded": 98, "failed": 2},
                     failures={"invalid_answer": 2}, spent_usd=Decimal("0.0123"))  # fmt: skip
    with JobProgress(console, "run tickets", every=0, summary=True) as progress:
        progress.update(done)
    last = console.file.getvalue().splitlines()[-1]
    assert last == "run tickets: finished, 100 of 100 done (98 ok, 2 failed); spent $0.0123; most failures: invalid_answer (2)", last
