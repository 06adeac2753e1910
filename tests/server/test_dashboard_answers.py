"""A job's succeeded answers on its dashboard page (issue 31: "paged, filterable, with the
request"):

- `?q=` keeps the answers whose custom_id or answer contains the text, in any case, in SQL
  on SQLite and PostgreSQL: a `%`, `_` or `/` in it is a character, not a wildcard, and the
  total is the filter's;
- the page's filter box does the same as one types (after a pause, from the first page),
  on a phone and on a desktop;
- each answer is shown with the request it answered (the text of its last user turn, cut
  at 2,000 characters; a request with no text is named by its endpoint), as text, never
  markup.

The jobs are built in the store and their outcomes applied by the engine's own ingest
(tests/engine/ledger_helpers.py), their stored requests then given the bodies each test
needs."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from lowtide.core.types import Request
from lowtide.engine import overview
from lowtide.store.schema import requests
from tests.engine.ledger_helpers import dispatch, ingest, stored_job
from tests.server.browser import boxes, open_tab, overflowing
from tests.server.test_dashboard_views import answered, get, job_with, refused

SCRIPT = "<script>window.pwned = 1</script> & <b>not bold</b>"


def chat(cid: str, user: Any, system: str = "You sort support tickets.") -> dict[str, Any]:
    turns = [{"role": "system", "content": system}, {"role": "user", "content": "an earlier question"},
             {"role": "assistant", "content": "an earlier answer"}, {"role": "user", "content": user}]  # fmt: skip
    return Request.chat(cid, "gpt-4o-mini", turns, max_tokens=64).to_payload()


def with_payloads(store, job: str, payloads: dict[str, dict[str, Any]]) -> None:
    """Give the job's requests these stored bodies (custom_id -> payload)."""
    with store.begin() as conn:
        job_id = conn.execute(sa.text("SELECT id FROM jobs WHERE name = :n"), {"n": job}).scalar_one()
        for cid, payload in payloads.items():
            conn.execute(sa.update(requests).where(requests.c.job_id == job_id, requests.c.custom_id == cid).values(payload=json.dumps(payload), head_id=None))


# 1. The filter, in SQL, on both stores ------------------------------------------------------
FILTERED = ["100% sure", "100 percent", "Billing_Issue", "billingXissue", "50/50 split", "BILLING issue"]


def test_the_answers_filter_is_literal_any_case_and_counted(store, tmp_path):
    outcomes = [answered(f"r{i}", text) for i, text in enumerate(FILTERED)]
    job = stored_job(store, tmp_path, name="filtered", n=len(outcomes) + 1)
    ingest(store, job, dispatch(store, job, "echo", [f"r{i}" for i in range(len(outcomes) + 1)]), "echo",
           [*outcomes, refused("r6", "invalid_request")])  # fmt: skip

    def found(search: str | None, **page: int) -> tuple[int, list[str]]:
        with store.read() as conn:
            got = overview.answer_rows(conn, job.id, search=search, **page)
        return got.total, [r["custom_id"] for r in got.rows]

    assert found(None) == found("") == (6, ["r0", "r1", "r2", "r3", "r4", "r5"])
    assert found("100%") == (1, ["r0"])  # `%` is a character: "100 percent" does not match
    assert found("g_i") == (1, ["r2"])  # `_` too: "billingXissue" does not match
    assert found("0/5") == (1, ["r4"])  # and the escape character itself
    assert found("billing") == (3, ["r2", "r3", "r5"])  # any case
    assert found("billing", limit=2) == (3, ["r2", "r3"]) and found("billing", offset=2, limit=2) == (3, ["r5"])
    assert found("R3") == (1, ["r3"])  # a custom_id
    assert found("r6") == found("invalid") == (0, [])  # a failed request is no answer
    assert found("nothing like it") == (0, [])


# 2. The text of a request --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("payload", "text"),
    [
        (chat("a", "the last question"), "the last question"),
        (chat("a", [{"type": "text", "text": "look at "}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "text", "text": "this"}]), "look at this"),  # fmt: skip
        ({"endpoint": "/v1/messages", "body": {"model": "m", "max_tokens": 9, "system": "be brief",
                                                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}}, "hi"),  # fmt: skip
        ({"endpoint": "/v1/responses", "body": {"model": "m", "instructions": "be brief", "input": "a prompt"}}, "a prompt"),
        ({"endpoint": "/v1/completions", "body": {"model": "m", "prompt": "Once upon"}}, "Once upon"),
        ({"endpoint": "/v1/chat/completions", "body": {"model": "m", "messages": [{"role": "system", "content": "only this"}]}}, "only this"),
        ({"model": "m", "messages": [{"role": "user", "content": "from lowtide 0.x"}]}, "from lowtide 0.x"),  # a legacy payload
        ({"endpoint": "/v1/embeddings", "body": {"model": "m", "input": [1, 2, 3]}}, None),  # token ids: no text
        ({"endpoint": "/v1/chat/completions", "body": {"model": "m", "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}]}]}}, None),  # fmt: skip
    ],
)
def test_the_text_of_a_request(payload, text):
    assert overview.request_text(json.dumps(payload)) == (text, payload.get("endpoint", "/v1/chat/completions"))


# 3. The API --------------------------------------------------------------------------------
def test_the_answers_api_filters_and_shows_each_request(serve, tmp_path):
    with serve() as s:
        outcomes = [answered("r0", "100% sure"), answered("r1", "100 percent"), answered("r2", "Billing issue")]
        job_with(s, tmp_path, "asked", [*outcomes, answered("r3", "fine"), refused("r4", "invalid_request")])
        with_payloads(s.server.store, "asked", {
            "r0": chat("r0", SCRIPT), "r1": chat("r1", "q" * 5000),
            "r2": {"endpoint": "/v1/embeddings", "body": {"model": "m", "input": [1, 2, 3]}},
        })  # fmt: skip
        every = get(s, "/dashboard/api/answers", job="asked")
        by_id = get(s, "/dashboard/api/answers", job="asked", q="R2")
        by_answer = get(s, "/dashboard/api/answers", job="asked", q="BILLING")
        percent = get(s, "/dashboard/api/answers", job="asked", q="100%")
        paged = get(s, "/dashboard/api/answers", job="asked", q="100", offset=1, limit=1)
        none = get(s, "/dashboard/api/answers", job="asked", q="invalid")

    assert every["total"] == 4 and every["q"] is None
    rows = {r["custom_id"]: r for r in every["rows"]}
    assert (rows["r0"]["prompt"], rows["r0"]["prompt_length"], rows["r0"]["endpoint"]) == (SCRIPT, len(SCRIPT), "/v1/chat/completions")
    assert (len(rows["r1"]["prompt"]), rows["r1"]["prompt_length"]) == (2000, 5000)  # cut as an answer is
    assert (rows["r2"]["prompt"], rows["r2"]["prompt_length"], rows["r2"]["endpoint"]) == (None, 0, "/v1/embeddings")
    assert rows["r3"]["prompt"] == "x" * 40  # as stored_job wrote it
    assert (by_id["total"], [r["custom_id"] for r in by_id["rows"]], by_id["q"]) == (1, ["r2"], "R2")
    assert (by_answer["total"], [r["custom_id"] for r in by_answer["rows"]]) == (1, ["r2"])
    assert (percent["total"], [r["custom_id"] for r in percent["rows"]]) == (1, ["r0"])
    assert (paged["total"], [r["custom_id"] for r in paged["rows"]]) == (2, ["r1"])
    assert (none["total"], none["rows"]) == (0, [])


# 4. The page: the filter box, and each request beside its answer -------------------------
@pytest.mark.parametrize("width", [390, 1400])
def test_the_filter_box_keeps_the_matching_answers_each_beside_its_request(serve, browser, tmp_path, width):
    from playwright.sync_api import expect

    with serve() as s:
        job_with(s, tmp_path, "typed", [answered(f"r{i}", f"answer {i}") for i in range(30)] + [refused("r30", "invalid_request")])
        with_payloads(s.server.store, "typed", {"r0": chat("r0", SCRIPT)} | {f"r{i}": chat(f"r{i}", f"question {i}") for i in range(1, 30)}
                      | {"r5": {"endpoint": "/v1/embeddings", "body": {"model": "m", "input": [1, 2, 3]}}})  # fmt: skip
        context, tab, errors = open_tab(browser, width, 900)
        asked: list[str | None] = []
        tab.on("request", lambda r: asked.append(httpx.URL(r.url).params.get("q")) if "/api/answers" in r.url else None)
        shown = lambda: tab.locator("#answer-rows tbody tr[data-custom-id]")  # noqa: E731
        try:
            tab.goto(f"{s.url}/dashboard?refresh=0.5#typed")
            expect(shown()).to_have_count(20)
            expect(tab.locator("#answers-range")).to_have_text("1–20 of 30")

            # Each answer beside the request it answered, as text.
            row = tab.locator('#answer-rows tr[data-custom-id="r2"]')
            expect(row.locator('[data-col="prompt"]')).to_have_text("question 2")
            expect(row.locator('[data-col="answer"]')).to_have_text("answer 2")
            expect(tab.locator('#answer-rows tr[data-custom-id="r0"] [data-col="prompt"]')).to_have_text(SCRIPT)
            assert tab.evaluate("window.pwned") is None
            assert tab.locator("#answer-rows script, #answer-rows b").count() == 0
            expect(tab.locator('#answer-rows tr[data-custom-id="r5"] [data-col="prompt"]')).to_contain_text("/v1/embeddings")
            if width > 900:  # a table: the request's cell left of the answer's, on the same line
                prompt, answer = boxes(tab, '#answer-rows tr[data-custom-id="r2"] td[data-label="request"]')[0], boxes(
                    tab, '#answer-rows tr[data-custom-id="r2"] td[data-label="answer"]')[0]  # fmt: skip
                assert prompt["right"] <= answer["x"] and prompt["y"] == answer["y"], (prompt, answer)
            assert tab.evaluate("document.documentElement.scrollWidth") <= width
            assert overflowing(tab, "#answer-rows td, #answers-search") == []

            # Typing from the second page: the first page of the matches, asked for once typing pauses.
            tab.click("#answers-next")
            expect(tab.locator("#answers-range")).to_have_text("21–30 of 30")
            tab.locator("#answers-search").press_sequentially("ANSWER 2", delay=30)
            expect(tab.locator("#answers-range")).to_have_text("1–11 of 11")
            expect(shown()).to_have_count(11)
            assert sorted(on_page(tab)) == sorted(["r2", *(f"r{i}" for i in range(20, 30))])
            expect(tab.locator("#answers-count")).to_have_text("(11 matching)")
            typed = {q for q in asked if q}
            assert "ANSWER 2" in typed and len(typed) < len("ANSWER 2"), typed  # not a request per keystroke

            tab.locator("#answers-search").fill("r1")  # a custom_id: r1, r10…r19
            expect(tab.locator('#answer-rows tr[data-custom-id="r10"]')).to_be_visible()
            expect(tab.locator("#answers-range")).to_have_text("1–11 of 11")
            assert sorted(on_page(tab)) == sorted(["r1", *(f"r{i}" for i in range(10, 20))])
            tab.locator("#answers-search").fill("50%")
            expect(tab.locator("#answer-rows tbody")).to_contain_text("no succeeded answer matches")
            expect(tab.locator("#answers-range")).to_have_text("0–0 of 0")
            tab.locator("#answers-search").fill("")
            expect(tab.locator("#answers-range")).to_have_text("1–20 of 30")
            assert tab.evaluate("document.documentElement.scrollWidth") <= width
            tab.goto("about:blank")
        finally:
            context.close()
    assert errors == [], errors


def on_page(tab) -> list[str]:
    return tab.evaluate("[...document.querySelectorAll('#answer-rows tbody tr[data-custom-id]')].map(r => r.dataset.customId)")
