"""The dashboard's jobs list and series on the hundredth night: a refresh reads a finished
job's rows once, not every 2 s (engine/job_figures.py), and still tells the truth after a finished job
is retried and finishes again between two refreshes. The same for every step of the
simulation: tests/sim/invariants.py `figures_current`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from lowtide.core.clock import ManualClock
from lowtide.engine.control import retry_job
from lowtide.store.db import Store
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv
from tests.server.conftest import Running, stepped
from tests.sqlite_steps import sqlite_steps

CLOCK = 1_700_000_000.0


def run_job(s: Running, tmp_path: Path, name: str, rows: int, at: float = CLOCK, **spec: Any) -> None:
    """A job of the server's store on echo, loaded and run to its end by an engine of its own
    (on a thread: the test holds no event loop the server's would meet)."""
    source = write_csv(tmp_path / f"{name}.csv", ticket_rows(rows))
    store = Store(s.server.store.location)
    try:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(drive_to_end, store, make_spec(source, name=name, **spec), ManualClock(at)).result()
    finally:
        store.close()


def jobs_list(s: Running, cold: bool = False) -> dict[str, Any]:
    """GET /dashboard/api/jobs and /dashboard/api/series (the page's two reads of every job),
    without the time they were read; `cold`: as a server just started reads them."""
    if cold:
        s.app.state.dashboard_kept = None
    out = {}
    for path in ("jobs", "series"):
        response = httpx.get(f"{s.url}/dashboard/api/{path}")
        assert response.status_code == 200, response.text
        out[path] = {k: v for k, v in response.json().items() if k != "generated_at"}
    return out


def test_a_refresh_reads_a_finished_jobs_rows_once(serve, tmp_path):
    with stepped(serve) as s:
        run_job(s, tmp_path, "small", 100)
        jobs_list(s)
        with sqlite_steps(s.server.store) as small:
            jobs_list(s)
        run_job(s, tmp_path, "big", 3000)
        first = jobs_list(s)
        with sqlite_steps(s.server.store) as big:
            again = jobs_list(s)
        cold = jobs_list(s, cold=True)
    assert again == first == cold
    assert [(j["name"], j["total"], j["done"]) for j in again["jobs"]["jobs"]] == [("big", 3000, 3000), ("small", 100, 100)]
    assert sum(p["attempts"] for p in again["series"]["points"]) == 3100
    # Read whole (before), a refresh's work grew with the rows: 30 times the small store's
    # (jobs: 830 -> 25,138 tens of steps; now 13 -> 17).
    assert big[0] < 2 * small[0], (small[0], big[0])


def test_a_job_retried_and_finished_again_between_two_refreshes_is_read_again(serve, tmp_path):
    failing = {f"T{1000 + i}": 1 for i in range(5)}  # their first attempt fails; one attempt each
    with stepped(serve) as s:
        run_job(s, tmp_path, "tickets", 20, retry={"max_attempts": 1}, route_options={"fail_attempts": failing})
        before = jobs_list(s)["jobs"]
        assert before["jobs"][0]["counts"] == {"succeeded": 15, "failed": 5}
        assert before["failures"] == {"server_error": 5}
        store = Store(s.server.store.location)
        try:
            assert retry_job(store, "tickets", ManualClock(CLOCK + 10)) == 5
        finally:
            store.close()
        run_job(s, tmp_path, "tickets", 20, CLOCK + 3600, retry={"max_attempts": 1})  # the same job, its failures answered
        after = jobs_list(s)
        assert after == jobs_list(s, cold=True)
    job = after["jobs"]["jobs"][0]
    assert (job["state"], job["counts"], job["cost"]["attempts"]) == ("finished", {"succeeded": 20}, 25)
    assert after["jobs"]["failures"] == {} and after["jobs"]["failure_figures"]["attempts"] == 5
    assert [(p["attempts"], p["failures"]) for p in after["series"]["points"]] == [(20, 5), (5, 0)]
