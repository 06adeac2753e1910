"""What a job's page shows, and the pages on a phone (issue 31's remainder), in headless
Chromium over the real store of a real `lowtide serve`:

- tapping a job at 390 px brings its page into view (it is drawn below the list), and
  "← all jobs" brings the list back;
- the evals page fits 390 px: its tables and chart scroll in their own boxes;
- "failed requests by reason" on a job's page is that job's, not the store's;
- "saving" counts succeeded attempts only: a job whose every request failed saved nothing,
  whatever its failed attempts cost;
- a job's page shows its succeeded answers, a page at a time, as text.

The jobs are built in the store and their outcomes applied by the engine's own ingest
(tests/engine/ledger_helpers.py), as `lowtide report`'s tests build theirs."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import httpx
import sqlalchemy as sa

from lowtide.core.clock import SystemClock
from lowtide.core.evals import build_eval
from lowtide.core.types import Outcome, Usage
from lowtide.engine.evals import load_eval, run_eval
from lowtide.engine.tick import Engine
from lowtide.store.schema import attempts, jobs
from tests.conftest import ticket_rows, write_csv
from tests.engine.ledger_helpers import dispatch, ingest, stored_job
from tests.server.browser import boxes, figures, on_all, open_tab, overflowing
from tests.server.conftest import Running
from tests.server.test_dashboard_evals import eval_spec

PRICED = {"model": "gpt-4o-mini", "route": "openai-batch"}  # the shipped catalog prices it; batch is half of real time
USAGE = {"input_tokens": 1000, "output_tokens": 200}


def answered(cid: str, text: str = "billing") -> Outcome:
    return Outcome(cid, True, text=text, usage=Usage(**USAGE), finish_reason="stop")


def refused(cid: str, code: str) -> Outcome:
    """A failure the provider billed (it reported tokens), and not retried."""
    return Outcome(cid, False, usage=Usage(**USAGE), error_code=code, error_message=f"{code} for {cid}", retryable=False)


def job_with(s: Running, tmp_path, name: str, outcomes: list[Outcome], **spec: Any) -> None:
    """A job of the server's store whose requests r0… got `outcomes`, from one batch."""
    store = s.server.store
    job = stored_job(store, tmp_path, name=name, n=len(outcomes), **spec)
    ids = [o.custom_id for o in outcomes]
    ingest(store, job, dispatch(store, job, spec.get("route", "echo"), ids), spec.get("route", "echo"), outcomes)


def get(s: Running, path: str, **params: Any) -> Any:
    response = httpx.get(f"{s.url}{path}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def in_view(tab, selector: str) -> dict[str, float]:
    """The element's top against the viewport: top (from the viewport's top) and height."""
    return tab.evaluate(
        "sel => { const r = document.querySelector(sel).getBoundingClientRect(); return {top: r.top, bottom: r.bottom, height: innerHeight}; }",
        selector,
    )


# 1. A tap on a phone ------------------------------------------------------------------------
def test_tapping_a_job_on_a_phone_brings_its_page_into_view(serve, browser, tmp_path):
    from playwright.sync_api import expect

    with serve() as s:
        for i in range(4):  # a list longer than the screen
            job_with(s, tmp_path, f"job{i}", [answered("r0", "y" * 3000), refused("r1", "invalid_request")], **PRICED)
        context, tab, errors = open_tab(browser, 390, 844)
        try:
            tab.goto(f"{s.url}/dashboard?refresh=0.5")
            row = tab.locator('#jobs tr[data-job="job3"]')  # the newest: the first line of the list
            expect(row).to_be_visible()
            row.click()
            expect(tab.locator('#detail[data-job="job3"]')).to_be_visible()
            expect(tab.locator("#detail-name")).to_have_text("job3")
            shown = in_view(tab, "#detail")
            assert 0 <= shown["top"] < shown["height"] / 2, shown  # the job's page, at the top of the screen
            expect(tab.locator('#answer-rows tr[data-custom-id="r0"]')).to_contain_text("3,000 characters")
            assert tab.evaluate("document.documentElement.scrollWidth") <= 390  # a long answer wraps
            assert overflowing(tab, "#detail, #answer-rows td") == []

            tab.click("#detail-close")  # the way back: the list, at the job tapped
            expect(tab.locator("#detail")).to_be_hidden()
            back = in_view(tab, '#jobs tr[data-job="job3"]')
            assert back["top"] >= 0 and back["bottom"] <= back["height"], back
            tab.goto("about:blank")
        finally:
            context.close()
    assert errors == [], errors


# 2. The evals page on a phone ---------------------------------------------------------------
def test_the_evals_page_fits_a_phone(serve, browser, tmp_path, monkeypatch):
    from playwright.sync_api import expect

    monkeypatch.setenv("OPENAI_API_KEY", "k")
    source = write_csv(tmp_path / "t.csv", ticket_rows(12))
    with serve() as s:
        ev = build_eval(eval_spec(source, f"{s.url}/v1"))
        load_eval(s.server.store, ev, SystemClock())

        async def go():
            async with Engine(s.server.store) as engine:
                return await run_eval(engine, ev, SystemClock())

        with ThreadPoolExecutor(1) as pool:  # a thread of its own: the browser holds an event loop on this one
            statuses = pool.submit(asyncio.run, go()).result()
        assert [st.counts for st in statuses] == [{"succeeded": 12}, {"succeeded": 12}]
        context, tab, errors = open_tab(browser, 390, 844)
        try:
            for path in ("/dashboard/evals/dash-ev", "/dashboard/evals"):
                tab.goto(f"{s.url}{path}")
                expect(tab.locator("h1")).to_be_visible()
                assert tab.evaluate("document.documentElement.scrollWidth") <= 390, path
            tab.goto(f"{s.url}/dashboard/evals/dash-ev")
            expect(tab.locator('#variants tr[data-variant="mini"]')).to_be_visible()
            chart = boxes(tab, "#chart")[0]
            assert chart["x"] >= 0 and chart["right"] <= 390 and chart["height"] > 100, chart  # scaled down, not cut
            tables = boxes(tab, ".scroll")  # a wide table scrolls across in a box of its own
            assert len(tables) >= 3 and all(b["x"] >= 0 and b["right"] <= 390 for b in tables), tables
            tab.goto("about:blank")
        finally:
            context.close()
    assert errors == [], errors


# 3. Failures by reason on a job's page ------------------------------------------------------
def test_failures_by_reason_on_a_jobs_page_are_that_jobs(serve, page, tmp_path):
    from playwright.sync_api import expect

    with serve() as s:
        job_with(s, tmp_path, "alpha", [refused("r0", "invalid_request"), refused("r1", "invalid_request")], **PRICED)
        job_with(s, tmp_path, "beta", [refused("r0", "content_filter"), answered("r1")], **PRICED)
        reasons = lambda: on_all(page, "#failures [data-reason]", "els => els.map(e => e.dataset.reason)")  # noqa: E731
        page.goto(f"{s.url}/dashboard?refresh=0.5")
        expect(page.locator("#failures [data-reason]")).to_have_count(2)
        assert sorted(reasons()) == ["content_filter", "invalid_request"]  # all jobs: the store's

        page.click('#jobs tr[data-job="alpha"]')
        expect(page.locator('#detail[data-job="alpha"]')).to_be_visible()
        expect(page.locator("#failures [data-reason]")).to_have_count(1, timeout=5000)
        assert reasons() == ["invalid_request"]
        expect(page.locator("#failures-box h2")).to_contain_text("job alpha")
        expect(page.locator("#failed-total")).to_have_text("(2)")

        page.click('#jobs tr[data-job="beta"]')
        expect(page.locator('#failures [data-reason="content_filter"]')).to_be_visible()
        assert reasons() == ["content_filter"]
        expect(page.locator("#failed-total")).to_have_text("(1)")

        page.click("#detail-close")
        expect(page.locator("#failures [data-reason]")).to_have_count(2)
        expect(page.locator("#failures-box h2")).to_contain_text("all jobs")
        page.goto("about:blank")


# 4. Saving: what succeeded saved -----------------------------------------------------------
def succeeded_saving(s: Running, name: str | None = None) -> Decimal:
    """Real time − cost over the succeeded attempts (of one job, or of all), from the store."""
    a = attempts.c
    with s.server.store.begin() as conn:
        where = [a.ok.is_(True), a.cost_picousd.is_not(None)]
        if name is not None:
            where.append(a.job_id == sa.select(jobs.c.id).where(jobs.c.name == name).scalar_subquery())
        pico = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(a.realtime_picousd - a.cost_picousd), 0)).where(*where)).scalar_one()
    return Decimal(pico) / 10**12


def test_a_job_whose_requests_all_failed_saved_nothing(serve, page, tmp_path):
    from playwright.sync_api import expect

    with serve() as s:
        job_with(s, tmp_path, "allbad", [refused(f"r{i}", "invalid_request") for i in range(3)], **PRICED)
        job_with(s, tmp_path, "mixed", [answered("r0"), refused("r1", "invalid_request")], **PRICED)
        listed = {j["name"]: j for j in get(s, "/dashboard/api/jobs")["jobs"]}
        allbad, mixed = get(s, "/dashboard/api/jobs/allbad"), get(s, "/dashboard/api/jobs/mixed")
        series = get(s, "/dashboard/api/series")
        saved = succeeded_saving(s, "mixed")
        page.goto(f"{s.url}/dashboard?refresh=0.5#allbad")
        expect(page.locator('#detail[data-job="allbad"]')).to_be_visible()
        expect(page.locator('#jobs tr[data-job="mixed"]')).to_be_visible()
        row, detail, totals = (figures(page, scope) for scope in ('#jobs tr[data-job="allbad"]', "#detail", "#totals"))
        mixed_row = figures(page, '#jobs tr[data-job="mixed"]')
        page.goto("about:blank")

    # The failed attempts were billed: a cost, and a real-time equivalent twice it.
    assert Decimal(allbad["cost"]["cost_usd"]) > 0 and Decimal(allbad["cost"]["realtime_usd"]) == 2 * Decimal(allbad["cost"]["cost_usd"])
    assert saved > 0 and Decimal(mixed["cost"]["cost_usd"]) > 0
    # None of that spend is a saving. The page: $0.00 for the failed job, in its line and on
    # its page; the total is the mixed job's.
    assert row["saving_usd"][0] == detail["saving_usd"][0] == "0", (row, detail)
    assert row["saving_usd"][1].startswith("$0.00") and detail["saving_usd"][1] == "$0.00"
    assert detail["saving_percent"] == ["", "-"]
    assert Decimal(mixed_row["saving_usd"][0]) == Decimal(totals["saving_usd"][0]) == saved
    # Its JSON: the mixed job saved what its one answer saved.
    assert (allbad["cost"]["succeeded_saving_usd"], allbad["cost"]["succeeded_saving_percent"]) == ("0", None)
    assert listed["allbad"]["cost"]["succeeded_saving_usd"] == "0"
    assert Decimal(mixed["cost"]["succeeded_saving_usd"]) == Decimal(listed["mixed"]["cost"]["succeeded_saving_usd"]) == saved
    assert sum(Decimal(p["saving_usd"]) for p in series["points"]) == saved  # the chart's saving too


# 5. Succeeded answers ----------------------------------------------------------------------
SCRIPT = '<script>window.pwned = 1</script> & <b>not bold</b>'


def test_a_jobs_page_shows_its_answers_a_page_at_a_time_as_text(serve, page, tmp_path):
    from playwright.sync_api import expect

    with serve() as s:
        outcomes = [answered("r0", SCRIPT), answered("r1", "x" * 5000)] + [answered(f"r{i}", f"answer {i}") for i in range(2, 29)]
        job_with(s, tmp_path, "answered", [*outcomes, refused("r29", "invalid_request")])  # on echo
        first = get(s, "/dashboard/api/answers", job="answered")
        rest = get(s, "/dashboard/api/answers", job="answered", offset=20, limit=20)
        too_many = httpx.get(f"{s.url}/dashboard/api/answers", params={"job": "answered", "limit": 201})
        missing = httpx.get(f"{s.url}/dashboard/api/answers", params={"job": "nope"})

        page.goto(f"{s.url}/dashboard?refresh=0.5#answered")
        expect(page.locator("#answer-rows tbody tr[data-custom-id]")).to_have_count(20)
        expect(page.locator("#answers-range")).to_have_text("1–20 of 29")
        cell = page.locator('#answer-rows tr[data-custom-id="r0"] [data-col="answer"]')
        expect(cell).to_have_text(SCRIPT)  # as text: the tags are characters on the page
        assert page.evaluate("window.pwned") is None
        assert page.locator("#answer-rows script, #answer-rows b").count() == 0
        expect(page.locator('#answer-rows tr[data-custom-id="r1"]')).to_contain_text("5,000 characters")
        page.click("#answers-next")
        expect(page.locator("#answers-range")).to_have_text("21–29 of 29")
        expect(page.locator("#answer-rows tbody tr[data-custom-id]")).to_have_count(9)
        assert page.locator('#answer-rows tr[data-custom-id="r29"]').count() == 0  # failed: not an answer
        page.goto("about:blank")

    assert first["total"] == 29 and first["limit"] == 20 and [r["custom_id"] for r in first["rows"]] == [f"r{i}" for i in range(20)]
    assert (first["rows"][0]["answer"], first["rows"][0]["route"]) == (SCRIPT, "echo")
    assert (len(first["rows"][1]["answer"]), first["rows"][1]["length"]) == (2000, 5000)  # cut, its length told
    assert [r["custom_id"] for r in rest["rows"]] == [f"r{i}" for i in range(20, 29)]
    assert too_many.status_code == 400 and missing.status_code == 404
