"""The real `lowtide dashboard` command (issue 31): the dashboard alone over a store where a
user's job ran and `lowtide serve` ran API batches. It lists the user's job and not serve's
(nor counts their failures), serves no batch API, refuses other sites as serve does, asks
for a key when given keys, and never writes the store."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from lowtide.core.clock import ManualClock
from lowtide.store.db import Store
from lowtide.store.schema import jobs
from tests.conftest import drive_to_end, make_spec, ticket_rows, wait_until, write_csv
from tests.server.browser import figures, leave, on_all
from tests.server.conftest import (
    chat_line,
    create_batch,
    message_request,
    running,
    wait_anthropic,
    wait_openai,
)

LOWTIDE = Path(sys.executable).with_name("lowtide")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not LOWTIDE.exists(), reason=f"no lowtide script at {LOWTIDE}")]
URL = re.compile(r"lowtide dashboard: (http://\S+/dashboard) ")


def _env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")} | extra


class Dashboard:
    def __init__(self, proc: subprocess.Popen, url: str, first_line: str):
        self.proc, self.url, self.first_line = proc, url, first_line
        self.base = url.removesuffix("/dashboard")

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(f"{self.base}{path}", timeout=30, **kw)

    def json(self, path: str, **kw: Any) -> Any:
        response = self.get(path, **kw)
        assert response.status_code == 200, response.text
        return response.json()


def start(cwd: Path, db: Path, *args: str, env: dict[str, str] | None = None) -> Dashboard:
    """`lowtide dashboard --port 0 --db DB …`, up: the URL it printed answers."""
    cmd = [str(LOWTIDE), "dashboard", "--port", "0", "--db", str(db), *args]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = ""
    while not URL.search(line):  # the start-up line comes once the socket is bound
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"lowtide dashboard ended before printing its URL: {proc.communicate(timeout=30)[0]}")
    board = Dashboard(proc, URL.search(line).group(1), line)

    def up() -> bool:
        assert proc.poll() is None, proc.communicate(timeout=30)[0]
        try:
            board.get("/dashboard")
            return True
        except httpx.TransportError:
            return False

    wait_until(up, timeout=90, what="lowtide dashboard to answer")  # a loaded machine starts it slowly
    return board


def stop(board: Dashboard) -> str:
    board.proc.terminate()
    return board.proc.communicate(timeout=30)[0]


def fingerprint(db: Path) -> tuple[str, int]:
    return hashlib.sha256(db.read_bytes()).hexdigest(), db.stat().st_mtime_ns


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, Any]:
    """A store with the user's job "tickets" (5 rows, T1001 rejected by echo: one failed
    request) and serve's API batches on the same store: an OpenAI batch (job `batch_…`, its
    "bad" rejected) and an Anthropic message batch over two models (jobs `msgbatch_…` and
    `msgbatch_….1`)."""
    root = tmp_path_factory.mktemp("dashboard")
    db = root / "lt.db"
    store = Store(str(db))
    try:
        spec = make_spec(write_csv(root / "tickets.csv", ticket_rows(5)), route_options={"reject": ["T1001"]})
        drive_to_end(store, spec, ManualClock())
    finally:
        store.close()
    with running(root, db=str(db), data_dir=root / "data", route_options={"reject": ["bad"]}) as s:
        client = s.openai()
        batch = wait_openai(client, create_batch(client, [chat_line("q0"), chat_line("q1"), chat_line("bad")]).id)
        messages = [message_request("m0"), message_request("m1", model="claude-other")]
        message_batch = wait_anthropic(s.anthropic(), s.anthropic().messages.batches.create(requests=messages).id)
    assert batch.status == "completed" and batch.request_counts.failed == 1
    serve_jobs = {batch.id, message_batch.id, f"{message_batch.id}.1"}
    with Store(str(db), create=False) as store, store.begin() as conn:
        assert set(conn.scalars(select(jobs.c.name))) == {"tickets"} | serve_jobs  # serve made its jobs
    return {"root": root, "db": db, "serve_jobs": serve_jobs, "batch": batch.id}


@pytest.fixture(scope="module")
def board(shared) -> Iterator[Dashboard]:
    running_board = start(shared["root"], shared["db"])
    try:
        yield running_board
    finally:
        stop(running_board)


def test_it_prints_one_line_with_the_url_of_the_port_it_got(board):
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/dashboard", board.url) and ":0/" not in board.url
    assert "read-only" in board.first_line and "no API key: answers only to localhost, IP addresses" in board.first_line


def test_the_page_and_its_json_show_the_users_job_and_not_serves(board, shared):
    page = board.get("/dashboard")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert board.get("/", follow_redirects=True).url.path == "/dashboard"  # the root leads to the page

    listed = board.json("/dashboard/api/jobs")
    assert [j["name"] for j in listed["jobs"]] == ["tickets"] and listed["job_count"] == 1
    assert listed["api_jobs"] is False and listed["api_jobs_hidden"] == 3
    # One failed request, once: serve's rejected "bad" is neither listed nor counted.
    assert listed["failures"] == {"invalid_request": 1} and listed["failure_figures"]["requests"] == 1
    assert listed["total"]["attempts"] == listed["jobs"][0]["cost"]["attempts"] == 5

    detail = board.json("/dashboard/api/jobs/tickets")
    assert detail["name"] == "tickets" and detail["failed"] == 1 and detail["done"] == 5
    failed = board.json("/dashboard/api/failed", params={"job": "tickets"})
    assert [r["custom_id"] for r in failed["rows"]] == ["T1001"]
    series = board.json("/dashboard/api/series")
    assert sum(p["attempts"] for p in series["points"]) == 5
    assert board.get("/dashboard/evals").status_code == 200

    for name in shared["serve_jobs"]:  # by name too: not here
        missing = board.get(f"/dashboard/api/jobs/{name}")
        assert missing.status_code == 404 and "api_jobs=true" in missing.json()["error"]
        assert board.get("/dashboard/api/failed", params={"job": name}).status_code == 404
        assert board.get("/dashboard/api/series", params={"job": name}).status_code == 404


def test_serves_jobs_are_shown_when_asked_for(board, shared):
    listed = board.json("/dashboard/api/jobs", params={"api_jobs": "true"})
    assert {j["name"] for j in listed["jobs"]} == {"tickets"} | shared["serve_jobs"] and listed["api_jobs_hidden"] == 0
    assert listed["failures"] == {"invalid_request": 2} and listed["api_batches"] == {"completed": 2}
    assert board.json(f"/dashboard/api/jobs/{shared['batch']}", params={"api_jobs": "true"})["name"] == shared["batch"]


def test_the_page_in_a_browser_lists_the_users_job_and_says_serves_are_left_out(board, shared, page):
    from playwright.sync_api import expect

    page.goto(f"{board.url}?refresh=0.5")
    expect(page.locator('#jobs tr[data-job="tickets"] [data-field="state"]')).to_have_text("finished")
    listed = on_all(page, "#jobs tr[data-job]", "trs => trs.map(tr => tr.dataset.job)")
    shown = figures(page, "#totals")
    page.goto(f"{board.url}?refresh=0.5&api_jobs=true")  # the page asks its endpoints the same
    expect(page.locator(f'#jobs tr[data-job="{shared["batch"]}"]')).to_be_visible()
    every = on_all(page, "#jobs tr[data-job]", "trs => trs.map(tr => tr.dataset.job)")
    leave(page)
    assert listed == ["tickets"]
    assert shown["api_jobs_hidden"] == ["3", "3 not listed (?api_jobs=true)"] and shown["failed_requests"][0] == "1"
    assert set(every) == {"tickets"} | shared["serve_jobs"]


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/files"), ("GET", "/v1/batches"), ("POST", "/v1/batches"), ("GET", "/v1/messages/batches"),
    ("POST", "/v1/chat/completions"), ("GET", "/v1beta/batches"), ("GET", "/metrics"), ("GET", "/openapi.json"),
])  # fmt: skip
def test_no_batch_api_is_served(board, method, path):
    response = httpx.request(method, f"{board.base}{path}", json={} if method == "POST" else None, timeout=30)
    assert response.status_code == 404, (path, response.text)


def test_other_sites_are_refused_as_serve_refuses_them(board):
    rebound = board.get("/dashboard/api/jobs", headers={"Host": "evil.example"})
    assert rebound.status_code == 400 and "--allow-host" in rebound.text
    cross = board.get("/dashboard/api/jobs", headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403 and "--allow-origin" in cross.text
    assert board.get("/dashboard/api/jobs", headers={"Host": "localhost"}).status_code == 200


def test_with_a_key_file_it_asks_for_a_key_and_never_writes_the_store(shared, tmp_path):
    db = shared["db"]
    before = fingerprint(db)
    keys = tmp_path / "keys"
    keys.write_text("# the dashboard's key\nview-key\n")
    board = start(tmp_path, db, "--api-key-file", str(keys), "--allow-host", "board.lan")
    try:
        assert board.get("/dashboard/api/jobs").status_code == 401
        assert board.get("/dashboard/api/jobs", headers={"x-api-key": "other"}).status_code == 401
        listed = board.json("/dashboard/api/jobs", headers={"x-api-key": "view-key"})
        assert [j["name"] for j in listed["jobs"]] == ["tickets"]
        assert board.get("/dashboard", params={"key": "view-key"}, follow_redirects=False).status_code == 303
        for _ in range(3):
            board.json("/dashboard/api/series", headers={"Authorization": "Bearer view-key"})
    finally:
        output = stop(board)
    assert "1 API key(s) accepted" in board.first_line and "view-key" not in output
    assert fingerprint(db) == before  # read-only: not a byte, not the mtime


def test_a_store_that_is_not_there_is_refused_and_not_made(tmp_path):
    missing = tmp_path / "none.db"
    done = subprocess.run([str(LOWTIDE), "dashboard", "--port", "0", "--db", str(missing)], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr  # a store error: nothing to show
    assert f"no store at {missing}" in done.stderr and not missing.exists()


# The app in process, on SQLite and PostgreSQL: which jobs are serve's ---------------------
def test_serves_jobs_are_told_apart_by_their_batch_on_each_store(store, tmp_path):
    """A job is serve's when a serve batch has its name, or its name before the first dot
    (`msgbatch_….1`); a user's job named like one, with no such batch, stays listed."""
    from fastapi.testclient import TestClient

    from lowtide.engine.loader import load_job
    from lowtide.server import records
    from lowtide.server.context import ServeConfig
    from lowtide.server.dashboard_app import create_dashboard_app

    source = write_csv(tmp_path / "tickets.csv", ticket_rows(2))
    for name in ("tickets", "batch_abc", "msgbatch_01xyz.1", "batch_ab", "batch_abc2", "lt.1"):
        load_job(store, make_spec(source, name=name), ManualClock())  # stored is enough (no event loop: Playwright's runs)
    with store.begin() as conn:
        for batch_id in ("batch_abc", "msgbatch_01xyz", "ltfeed"):
            records.insert_batch(conn, id=batch_id, api="openai", jobs=[], faults={}, total=0, rejected=0, created_at=0.0, expires_at=1.0)
    app = create_dashboard_app(ServeConfig(db=store.location))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        names = {j["name"] for j in client.get("/dashboard/api/jobs").json()["jobs"]}
        every = {j["name"] for j in client.get("/dashboard/api/jobs", params={"api_jobs": "true"}).json()["jobs"]}
        hidden = client.get("/dashboard/api/jobs/msgbatch_01xyz.1")
    assert names == {"tickets", "batch_ab", "batch_abc2", "lt.1"}
    assert every == names | {"batch_abc", "msgbatch_01xyz.1"}
    assert hidden.status_code == 404 and "api_jobs=true" in hidden.json()["error"]
