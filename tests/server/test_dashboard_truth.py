"""The dashboard tells the truth at a glance (issue 19): a job whose 200 rows all failed
reads as failed — in its JSON, and in headless Chromium at 1400 px, 800 px and a phone's
390 px, where the bar is red from end to end, the page reflows without a horizontal scroll,
and no two sections overlap. One failure count everywhere (failed requests), failed attempts
apart; the failed rows paged and filtered; the provider batches' timeline; ETA and cost so
far against the estimate. Layouts are compared by element boxes, never by pixels."""

from __future__ import annotations

import csv
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from lowtide.core.clock import ManualClock
from lowtide.store.db import Store
from lowtide.store.schema import attempts, jobs, requests
from tests.conftest import drive_to_end, make_spec
from tests.server.browser import boxes, on_all, open_tab, overflowing, overlap
from tests.server.conftest import Running
from tests.server.test_metrics import run_priced_job

ROWS = 200
SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}


def all_failed_job(s: Running, tmp_path: Path, name: str = "allbad", rows: int = ROWS) -> None:
    """A job of the server's store on echo whose every answer fails its schema (echo's
    `answer: message`), and fails again after the one repair: each row ends `failed` with
    `invalid_output`, after two billed attempts. Run by the engine, with its own clock."""
    source = tmp_path / f"{name}.csv"
    with source.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["ticket_id", "body"])
        out.writerows([[f"T{i:04d}", f"ticket text {i}"] for i in range(rows)])
    spec = make_spec(source, name=name, response_schema=SCHEMA, route_options={"answer": "message"})
    store = Store(s.server.store.location)
    try:  # on a thread of its own: a browser test holds an event loop on this one
        with ThreadPoolExecutor(1) as pool:
            status = pool.submit(drive_to_end, store, spec, ManualClock(1_700_000_000.0)).result()
    finally:
        store.close()
    assert status.counts == {"failed": rows}


def get(s: Running, path: str, **params) -> Any:
    response = httpx.get(f"{s.url}{path}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


# The JSON ----------------------------------------------------------------------------------
def test_a_job_whose_rows_all_failed_has_one_failure_count_everywhere(serve, tmp_path):
    with serve() as s:
        all_failed_job(s, tmp_path)
        listed = get(s, "/dashboard/api/jobs")
        detail = get(s, "/dashboard/api/jobs/allbad")
        with s.server.store.begin() as conn:
            job_id = conn.execute(sa.select(jobs.c.id).where(jobs.c.name == "allbad")).scalar_one()
            failed_tries = conn.execute(
                sa.select(sa.func.count()).select_from(attempts).where(attempts.c.job_id == job_id, attempts.c.ok.is_(False))
            ).scalar_one()

    job = next(j for j in listed["jobs"] if j["name"] == "allbad")
    none = {"succeeded": 0, "cancelled": 0, "waiting": 0, "in_flight": 0, "pending": 0}
    assert job["progress"] == none | {"failed": ROWS, "done": ROWS, "total": ROWS}  # not 200/200 succeeded
    assert detail["progress"] == job["progress"]
    # Failed requests: the jobs table, the reasons, the store-wide tile, the job page.
    assert job["failed"] == detail["failed"] == listed["failure_figures"]["requests"] == detail["failure_figures"]["requests"] == ROWS
    assert listed["failures"] == detail["failures"] == detail["failure_figures"]["by_reason"] == {"invalid_output": ROWS}
    assert sum(listed["failures"].values()) == listed["failure_figures"]["requests"]
    # Failed attempts (the answer, then the repair: two per row) are the ledger's, apart.
    assert detail["failure_figures"]["attempts"] == detail["cost"]["failures"] == failed_tries == 2 * ROWS
    assert detail["failure_figures"]["billed_attempts"] == detail["cost"]["billed_failures"]
    assert listed["failure_figures"]["attempts"] == listed["total"]["failures"] == 2 * ROWS
    assert detail["eta"] is None and detail["finished_at"] is not None  # nothing left
    assert detail["batches"] == [] and detail["batch_count"] == 0  # echo is a direct route


def test_failed_rows_are_paged_and_filtered(serve, tmp_path):
    with serve() as s:
        all_failed_job(s, tmp_path)
        pages = [get(s, "/dashboard/api/failed", job="allbad", offset=o, limit=50) for o in range(0, ROWS, 50)]
        with s.server.store.begin() as conn:
            expected = conn.execute(
                sa.select(requests.c.custom_id).join(jobs, jobs.c.id == requests.c.job_id)
                .where(jobs.c.name == "allbad").order_by(requests.c.source_row)
            ).scalars().all()  # fmt: skip
        one = expected[123]
        by_id = get(s, "/dashboard/api/failed", job="allbad", q=one.upper())
        by_message = get(s, "/dashboard/api/failed", job="allbad", q="after one repair", limit=1)
        by_reason = get(s, "/dashboard/api/failed", job="allbad", reason="invalid_output", limit=1)
        no_reason = get(s, "/dashboard/api/failed", job="allbad", reason="expired")
        beyond = get(s, "/dashboard/api/failed", job="allbad", offset=ROWS)
        missing = httpx.get(f"{s.url}/dashboard/api/failed", params={"job": "nope"})
        too_many = httpx.get(f"{s.url}/dashboard/api/failed", params={"job": "allbad", "limit": 201})
        no_job = httpx.get(f"{s.url}/dashboard/api/failed")

    rows = [r for p in pages for r in p["rows"]]
    assert [r["custom_id"] for r in rows] == expected and len(set(expected)) == ROWS  # every row once, in source order
    assert all(p["total"] == ROWS and len(p["rows"]) == 50 for p in pages)
    for r in rows:
        assert (r["reason"], r["attempts"], r["route"]) == ("invalid_output", 2, "echo")
        assert r["message"].startswith("answer invalid after one repair attempt: "), r["message"]
    assert [r["custom_id"] for r in by_id["rows"]] == [one] and by_id["total"] == 1
    assert by_message["total"] == by_reason["total"] == ROWS and len(by_message["rows"]) == 1
    assert no_reason["total"] == 0 and beyond["rows"] == [] and beyond["total"] == ROWS
    assert missing.status_code == 404 and 'no job named "nope"' in missing.json()["error"]
    assert too_many.status_code == no_job.status_code == 400  # the server's answer to a bad parameter
    assert "limit" in too_many.text and "job" in no_job.text


def test_the_batch_timeline_eta_and_estimate_of_a_batch_job(serve, tmp_path, monkeypatch):
    with serve() as s:
        run_priced_job(s, tmp_path, monkeypatch)  # openai-batch against the server itself
        detail = get(s, "/dashboard/api/jobs/tickets")

    assert detail["batch_count"] == len(detail["batches"]) >= 1
    for b in detail["batches"]:
        assert b["provider_id"].startswith("batch_") and b["state"] == "ended" and b["route"] == "openai-batch"
        times = [b["created_at"], b["submitted_at"], *(p["at"] for p in b["phases"]), b["ended_at"]]
        assert times == sorted(times), b  # created, sent, each phase when first seen, ended
        phases = [p["phase"] for p in b["phases"]]
        assert phases and phases[-1] == "completed" and len(phases) == len(set(phases)), phases
        assert set(phases) <= {"validating", "in_progress", "finalizing", "completed"}
        assert b["counts"]["in_batch"] == 0 and b["counts"]["failed"] == 0
    assert sum(b["counts"]["succeeded"] for b in detail["batches"]) == sum(b["size"] for b in detail["batches"]) == 5
    assert detail["eta"] is None  # finished
    est = detail["estimate"]
    assert est["requests"] == 5 and est["usd"] is not None
    assert Decimal(est["usd"]) >= Decimal(detail["cost"]["cost_usd"]) > 0  # an upper bound: max_tokens of output


# The page in Chromium, at three widths ------------------------------------------------------
WIDTHS = (1400, 800, 390)


def segment_widths(tab, row: str) -> dict[str, float]:
    return on_all(tab,
        f"{row} [data-bar] .seg", "els => Object.fromEntries(els.map(e => [e.dataset.state, e.getBoundingClientRect().width]))"
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_the_page_reads_true_and_reflows(serve, browser, tmp_path, monkeypatch, width):
    from playwright.sync_api import expect

    with serve() as s:
        all_failed_job(s, tmp_path)
        run_priced_job(s, tmp_path, monkeypatch)
        context, tab, errors = open_tab(browser, width, 900)
        try:
            tab.goto(f"{s.url}/dashboard?refresh=0.5#allbad")
            expect(tab.locator('#detail[data-job="allbad"]')).to_be_visible()
            expect(tab.locator("#failed-rows tbody tr[data-custom-id]")).to_have_count(50)
            expect(tab.locator("#failed-range")).to_have_text("1–50 of 200")
            expect(tab.locator('#jobs tr[data-job="tickets"] [data-field="state"]')).to_have_text("finished")
            tab.screenshot(path=str(tmp_path / f"dashboard-{width}.png"), full_page=True)  # kept for a look on failure

            # The bars: all red for the failed job, all green for the one that succeeded.
            bad, good = segment_widths(tab, '#jobs tr[data-job="allbad"]'), segment_widths(tab, '#jobs tr[data-job="tickets"]')
            bar = boxes(tab, '#jobs tr[data-job="allbad"] [data-bar]')[0]["width"]
            assert bar > 40 and abs(bad["failed"] - bar) < 1 and bad["succeeded"] == 0, (bad, bar)
            assert abs(good["succeeded"] - bar) < 1 and good["failed"] == 0, good
            colours = on_all(tab,
                '#jobs tr[data-job="allbad"] [data-bar] .seg', "els => Object.fromEntries(els.map(e => [e.dataset.state, getComputedStyle(e).backgroundColor]))"
            )
            assert colours["failed"] == "rgb(192, 68, 58)" and len(set(colours.values())) == 5, colours
            assert "200 failed" in tab.get_attribute('#jobs tr[data-job="allbad"] [data-bar]', "aria-label")
            big = segment_widths(tab, "#detail-progress")
            assert big["failed"] > 0.9 * (width - 80) and big["succeeded"] == 0, big
            expect(tab.locator('#detail [data-field="failed_requests"]')).to_have_text("200")
            expect(tab.locator('#detail [data-field="failed_attempts"]')).to_contain_text("400 failed attempts")
            expect(tab.locator('#jobs tr[data-job="allbad"] [data-field="failed"]')).to_have_text("200")
            expect(tab.locator('#totals [data-field="failed_requests"]')).to_have_text("200")

            # Layout: no horizontal scroll, nothing cut, sections side by side or stacked, never on top.
            assert tab.evaluate("document.documentElement.scrollWidth") <= width
            sections = boxes(tab, "main section")
            assert len(sections) == 5 and all(b["x"] >= 0 and b["right"] <= width + 0.5 for b in sections), sections
            assert all(overlap(a, b) == 0 for i, a in enumerate(sections) for b in sections[i + 1:]), sections
            assert overflowing(tab, "main section, #jobs td, #failed-rows td, .tile") == []
            series, reasons = boxes(tab, "#series")[0], boxes(tab, "#failures-box")[0]
            cells = boxes(tab, '#jobs tr[data-job="allbad"] td')
            if width > 900:  # a table row, two columns of charts
                assert len({round(c["y"]) for c in cells}) == 1 and series["y"] == reasons["y"] and series["right"] <= reasons["x"]
                assert tab.is_visible("#jobs thead")
            else:  # one card per row, labelled cells; one column
                assert len({round(c["y"]) for c in cells}) > 2 and reasons["y"] >= series["bottom"]
                assert not tab.is_visible("#jobs thead")
                labels = on_all(tab,
                    '#jobs tr[data-job="allbad"] td', "els => els.map(e => getComputedStyle(e, '::before').content)"
                )
                assert '"failed"' in labels and '"cost"' in labels, labels

            # The failed rows: paged, filtered by reason and by text.
            tab.click("#failed-next")
            expect(tab.locator("#failed-range")).to_have_text("51–100 of 200")
            first = tab.get_attribute("#failed-rows tbody tr[data-custom-id]", "data-custom-id")
            tab.fill("#failed-search", first)
            expect(tab.locator("#failed-rows tbody tr[data-custom-id]")).to_have_count(1)
            expect(tab.locator("#failed-count")).to_have_text("(1 matching)")
            row = tab.locator(f'#failed-rows tr[data-custom-id="{first}"]')
            expect(row.locator('[data-col="reason"]')).to_have_text("invalid_output")
            expect(row.locator('[data-col="attempts"]')).to_have_text("2")
            expect(row.locator('[data-col="message"]')).to_contain_text("answer invalid after one repair attempt")
            tab.fill("#failed-search", "")
            tab.select_option("#failed-reason", "invalid_output")
            expect(tab.locator("#failed-range")).to_have_text("1–50 of 200")
            assert overflowing(tab, "#failed-rows td") == []

            # The batch job: its timeline.
            tab.click('#jobs tr[data-job="tickets"]')
            expect(tab.locator('#detail[data-job="tickets"]')).to_be_visible()
            expect(tab.locator("#timeline tbody tr[data-batch]").first).to_contain_text("completed")
            expect(tab.locator("#failed-rows tbody")).to_contain_text("no failed requests")
            assert tab.evaluate("document.documentElement.scrollWidth") <= width
            tab.goto("about:blank")
        finally:
            context.close()
    assert errors == [], errors
