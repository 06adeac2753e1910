"""`/dashboard`: its JSON against `lowtide report --json` and the store, its key check, and
the page itself end to end in headless Chromium (the system's `chromium`, driven by
Playwright): it loads, shows a finished job's figures as `lowtide report --json` prints
them, and follows a running job without a reload."""

from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import httpx
import sqlalchemy as sa

from lowtide.core.pricing import PRICES_ENV
from lowtide.engine.control import job_status
from lowtide.engine.loader import load_job
from lowtide.engine.report import cost_report
from lowtide.store.schema import requests
from tests.cli.test_cli import LOWTIDE, Cli
from tests.engine.ledger_helpers import dispatch, ingest, ok, stored_job
from tests.engine.test_tiers import PRICES, _batch_history, _spec
from tests.routes.upstream import Upstream
from tests.server.browser import figures, leave, on_all
from tests.server.conftest import Running, chat_line, create_batch, wait_openai
from tests.server.test_metrics import run_priced_job

FIGURES = ("cost_usd", "realtime_usd", "saving_usd", "saving_percent", "unknown_cost_attempts", "input_tokens",
           "cached_input_tokens", "cache_write_tokens", "output_tokens", "reasoning_tokens", "cache_hit_share",
           "attempts", "failures", "stale_attempts")  # fmt: skip
MONEY = ("cost_usd", "realtime_usd", "saving_usd")
TOKENS = ("input_tokens", "cached_input_tokens", "cache_write_tokens", "output_tokens", "reasoning_tokens", "attempts")


def report_json(s: Running, tmp_path, job: str) -> dict[str, Any]:
    """`lowtide report --job JOB --json`, the real command, against the server's store."""
    assert LOWTIDE.exists(), f"no lowtide script at {LOWTIDE}"
    code, out = Cli(tmp_path, s.server.store.location)("report", "--job", job, "--json")
    assert code == 0, out
    return json.loads(out)["total"]


REJECT = {"route_options": {"reject": ["bad"]}}  # echo fails the request "bad" (invalid_request)


def ledger(s: Running, tmp_path, monkeypatch) -> str:
    """A priced job (openai-batch, gpt-4o-mini), an API batch on echo with one request that
    fails (a server started with REJECT), and a job "eval" whose one attempt has no price
    (gpt-9-turbo); returns the API batch's id (its job's name)."""
    run_priced_job(s, tmp_path, monkeypatch)
    unpriced = stored_job(s.server.store, tmp_path, name="eval", n=1, model="gpt-9-turbo", route="openai-batch")
    ingest(s.server.store, unpriced, dispatch(s.server.store, unpriced, "openai-batch", ["r0"]), "openai-batch", [ok("r0", input_tokens=10)])
    client = s.openai()
    items = [chat_line(f"q{i}") for i in range(3)] + [chat_line("bad")]
    return wait_openai(client, create_batch(client, items).id).id


def get(s: Running, path: str, **kw) -> Any:
    response = httpx.get(f"{s.url}{path}", **kw)
    assert response.status_code == 200, response.text
    return response.json()


# The JSON API ------------------------------------------------------------------------------
def test_the_api_gives_lowtide_reports_figures_and_the_stores_counts(serve, tmp_path, monkeypatch):
    with serve(**REJECT) as s:
        batch = ledger(s, tmp_path, monkeypatch)
        listed = get(s, "/dashboard/api/jobs")
        detail = get(s, "/dashboard/api/jobs/tickets")
        batch_detail = get(s, f"/dashboard/api/jobs/{batch}")
        series = get(s, "/dashboard/api/series")
        job_series = get(s, "/dashboard/api/series", params={"job": "tickets", "bucket": "hour"})
        store = s.server.store
        by_job = {g.group: g.as_dict() for g in cost_report(store, by="job").groups}
        total = cost_report(store).total.as_dict()
        status = job_status(store, batch)
        report = report_json(s, tmp_path, "tickets")
        missing = httpx.get(f"{s.url}/dashboard/api/jobs/nope")
        bad_bucket = httpx.get(f"{s.url}/dashboard/api/series", params={"bucket": "week"})

    jobs = {j["name"]: j for j in listed["jobs"]}
    assert set(jobs) == set(by_job) and listed["job_count"] == len(jobs) == 4  # with the route's API batch
    assert (jobs["eval"]["cost"]["cost_usd"], jobs["eval"]["cost"]["unknown_cost_attempts"]) == ("0", 1)
    assert {name: j["cost"] for name, j in jobs.items()} == by_job
    assert listed["total"] == total
    assert jobs["tickets"] | {"cost": None} == jobs["tickets"] | {
        "state": "finished", "route": "openai-batch", "total": 5, "done": 5, "counts": {"succeeded": 5}, "cost": None,
    }  # fmt: skip
    assert (jobs[batch]["done"], jobs[batch]["total"], jobs[batch]["counts"]) == (4, 4, {"succeeded": 3, "failed": 1})
    assert listed["failures"] == status.failures == {"invalid_request": 1}
    assert listed["api_batches"] == {"completed": 2}

    # One job: the figures `lowtide report --job tickets --json` prints, to the character.
    assert detail["cost"] == report | {"group": "total"}
    assert Decimal(report["cost_usd"]) > 0 and report["saving_percent"] == "50.0"
    assert [g["group"] for g in detail["routes"]] == ["openai-batch"]
    assert detail["placement"] == [{"route": "openai-batch", "reason": None, "state": "succeeded", "count": 5}]
    assert detail["tiers"] == []  # not a chain: the page hides the tiers table
    assert (detail["phases"], detail["failures"], detail["budget_usd"]) == ({}, {}, None)
    assert batch_detail["failures"] == status.failures and batch_detail["counts"] == status.counts
    assert any(e.startswith("finished") for e in detail["events"])

    # The series adds up to the totals.
    def added(points: list[dict], key: str) -> Decimal:
        return sum((Decimal(p[key]) for p in points), Decimal(0))

    for key in ("cost_usd", "realtime_usd", "saving_usd"):
        assert added(series["points"], key) == Decimal(total[key])
        assert added(job_series["points"], key) == Decimal(report[key])
    assert sum(p["attempts"] for p in series["points"]) == total["attempts"]
    assert series["bucket"] in ("minute", "hour", "day") and job_series["bucket"] == "hour"
    assert all(p["t"] % 3600 == 0 for p in job_series["points"])
    assert missing.status_code == 404 and 'no job named "nope"' in missing.json()["error"]
    assert bad_bucket.status_code == 400


def test_with_keys_the_dashboard_needs_one_and_never_shows_it(serve):
    with serve(api_keys=("sekret", "other")) as s:
        for path in ("/dashboard", "/dashboard/api/jobs", "/dashboard/api/jobs/x", "/dashboard/api/series", "/metrics"):
            refused = httpx.get(f"{s.url}{path}")
            assert refused.status_code == 401, path
            assert "/dashboard?key=" in refused.text
        assert httpx.get(f"{s.url}/dashboard?key=wrong").status_code == 401
        assert httpx.get(f"{s.url}/dashboard/api/jobs", cookies={"lowtide_dashboard": "sekret"}).status_code == 401
        assert httpx.get(f"{s.url}/dashboard/api/jobs", headers={"x-api-key": "other"}).status_code == 200
        assert httpx.get(f"{s.url}/dashboard/api/jobs", headers={"authorization": "Bearer sekret"}).status_code == 200

        with httpx.Client(base_url=s.url, follow_redirects=True) as browser:
            opened = browser.get("/dashboard", params={"key": "sekret", "refresh": "1"})
            assert opened.history[0].status_code == 303 and str(opened.url) == f"{s.url}/dashboard?refresh=1"
            cookie = browser.cookies["lowtide_dashboard"]
            assert "sekret" not in cookie and "httponly" in opened.history[0].headers["set-cookie"].lower()
            assert opened.status_code == 200 and "sekret" not in opened.text and 'data-refresh="1000"' in opened.text
            assert browser.get("/dashboard/api/jobs").status_code == 200
            assert browser.get("/metrics").status_code == 200
            # The cookie opens the dashboard only, not the Batch API.
            assert browser.get("/v1/batches").status_code == 401


def test_without_keys_the_dashboard_is_open(server):
    page = httpx.get(f"{server.url}/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert get(server, "/dashboard/api/jobs")["jobs"] == []


# The page in Chromium ----------------------------------------------------------------------
def as_shown(amount: str) -> Decimal:
    """What the page shows for an amount: six decimals at most."""
    return Decimal(amount).quantize(Decimal("0.000001"), ROUND_HALF_UP) if -Decimal(amount).as_tuple().exponent > 6 else Decimal(amount)


def test_the_page_shows_a_finished_jobs_figures_as_lowtide_report_does(serve, page, tmp_path, monkeypatch):
    from playwright.sync_api import expect

    with serve(**REJECT) as s:
        page.goto(f"{s.url}/dashboard?refresh=0.5")
        expect(page.locator("#jobs tbody")).to_contain_text("no jobs in this store yet")
        expect(page.locator("#status")).to_contain_text("updated")
        ledger(s, tmp_path, monkeypatch)
        report = report_json(s, tmp_path, "tickets")

        row = page.locator('#jobs tr[data-job="tickets"]')
        expect(row.locator('[data-field="state"]')).to_have_text("finished")  # arrived without a reload
        expect(page.locator('#jobs tr[data-job="eval"] [data-field="cost_usd"]')).to_have_text("unknown")  # not $0
        expect(page.locator('#failures [data-reason="invalid_request"]')).to_be_visible()  # all jobs: the echo batch's "bad"
        page.click('#jobs tr[data-job="tickets"]')
        expect(page.locator('#detail[data-job="tickets"]')).to_be_visible()
        shown = figures(page, "#detail")
        listed = figures(page, '#jobs tr[data-job="tickets"]')
        expect(page.locator("#failures")).to_have_text("no failed requests")  # on tickets' page: its own (issue 31)
        leave(page)

    for name in FIGURES:
        value = "" if report[name] is None else str(report[name])
        assert shown[name][0] == value, name  # the exact figure, as `lowtide report --json` prints it
    for name in MONEY:
        text = shown[name][1]
        assert re.fullmatch(r"\$[\d,]+\.\d{2,6}", text), text  # 2-6 decimals
        assert Decimal(text[1:].replace(",", "")) == as_shown(report[name]), (name, text)
        assert listed[name][0] == report[name]
    for name in TOKENS:
        assert int(shown[name][1].replace(",", "")) == report[name], name
    assert shown["saving_percent"][1] == f"{report['saving_percent']}%"
    assert (shown["done"], shown["total"]) == (["5", "5"], ["5", "5"])
    assert (listed["input_tokens"][0], listed["output_tokens"][0]) == (str(report["input_tokens"]), str(report["output_tokens"]))


def test_a_refresh_that_brings_nothing_new_leaves_the_page_as_it_was(serve, page, tmp_path, monkeypatch):
    """A reader's text selection survives the polling: a section is drawn again only when
    what it shows changed (before, every refresh replaced every table row)."""
    from playwright.sync_api import expect

    with serve() as s:
        run_priced_job(s, tmp_path, monkeypatch)
        page.goto(f"{s.url}/dashboard?refresh=0.2#tickets")
        expect(page.locator('#detail[data-job="tickets"]')).to_be_visible()
        expect(page.locator('#jobs tr[data-job="tickets"] [data-field="state"]')).to_have_text("finished")
        page.evaluate("""() => {
            const cell = document.querySelector('#jobs tr[data-job="tickets"] [data-field="cost_usd"]');
            window.held = [cell, document.querySelector("#detail-facts div"), document.querySelector("#series-chart *"),
                           document.querySelector("#totals .tile")];
            getSelection().selectAllChildren(cell);
        }""")
        selected = page.evaluate("getSelection().toString()")
        for _ in range(2):  # the first refresh after the mark has drawn all it would when the second answers
            with page.expect_response(lambda r: "/dashboard/api/jobs" in r.url and "/jobs/" not in r.url):
                pass
        assert page.evaluate("window.held.map(e => e.isConnected)") == [True] * 4
        assert selected and page.evaluate("getSelection().toString()") == selected
        leave(page)


def test_the_page_follows_a_running_job_without_a_reload(serve, gate, page):
    from playwright.sync_api import expect

    with serve(routes={"echo": gate}, api_keys=("sekret",)) as s:
        client = s.openai(key="sekret")
        batch = create_batch(client, [chat_line(f"q{i}") for i in range(3)])
        page.goto(f"{s.url}/dashboard?key=sekret&refresh=0.3")  # sets the cookie, comes back without the key
        assert "sekret" not in page.url and "sekret" not in page.content()
        page.evaluate("window.stillTheSamePage = true")

        done = page.locator(f'#jobs tr[data-job="{batch.id}"] [data-field="done"]')
        expect(done).to_have_text("0")
        expect(page.locator(f'#jobs tr[data-job="{batch.id}"] [data-field="total"]')).to_have_text("3")
        page.click(f'#jobs tr[data-job="{batch.id}"]')
        expect(page.locator("#detail-phases")).to_contain_text("running")  # a live dispatch
        gate.release(1)
        expect(done).to_have_text("1")
        gate.release(1)
        expect(done).to_have_text("2")
        gate.release()
        expect(done).to_have_text("3")
        expect(page.locator(f'#jobs tr[data-job="{batch.id}"] [data-field="state"]')).to_have_text("finished")
        expect(page.locator('#detail [data-field="attempts"]')).to_have_text("3")
        assert page.evaluate("window.stillTheSamePage") is True
        leave(page)


def test_a_chain_jobs_page_shows_its_requests_by_tier_as_lowtide_status_does(serve, page, tmp_path, monkeypatch, clock):
    """A `route: auto` chain (echo-batch, then openai flex, then openai): where its pending
    requests wait, tier by tier in the chain's order, as `lowtide status` counts them."""
    from playwright.sync_api import expect

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789abcdef")
    (tmp_path / "prices.yaml").write_text(PRICES)
    monkeypatch.setenv(PRICES_ENV, str(tmp_path / "prices.yaml"))
    with Upstream() as upstream, serve() as s:
        store = s.server.store
        _batch_history(store)
        load_job(store, _spec(tmp_path, upstream, 20), clock)
        with store.begin() as conn:  # five have moved up to flex, as a hand-over does
            moved = sa.select(requests.c.id).where(requests.c.custom_id.in_([f"T{1000 + i}" for i in range(5)]))
            conn.execute(sa.update(requests).where(requests.c.id.in_(moved)).values(lane="tier1"))
        detail = get(s, "/dashboard/api/jobs/tickets")
        status = job_status(store, "tickets")
        page.goto(f"{s.url}/dashboard?refresh=0.5")
        page.click('#jobs tr[data-job="tickets"]')
        box = page.locator("#detail-tiers-box")
        expect(box).to_be_visible()
        expect(page.locator('#detail-tiers tr[data-tier="openai (flex)"]')).to_contain_text("5")
        shown = on_all(page, "#detail-tiers tr[data-tier]", "trs => trs.map(tr => [...tr.cells].map(c => c.textContent))")
        leave(page)

    assert status.tiers == [("echo-batch", "pending", 15), ("openai (flex)", "pending", 5)]
    assert detail["tiers"] == [{"tier": t, "state": st, "count": n} for t, st, n in status.tiers]
    assert shown == [[t, st, str(n)] for t, st, n in status.tiers]
