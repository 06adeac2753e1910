"""A budget's estimate is an upper bound of what the provider can bill, beyond plain text:
prompt-cache writes are priced at the write rate, each image at the most one image costs on
the model, and a request whose input has no bound (a PDF, audio) is never sent by a budgeted
job. Jobs are loaded by the real loader into the real SQLite store; each test holds the
estimate against the provider's bill priced by lowtide's own pricing code.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
import sqlalchemy as sa

from lowtide.core.clock import SystemClock
from lowtide.core.pricing import attempt_cost, load_catalog, token_usd
from lowtide.core.states import DispatchState, JobState
from lowtide.core.tokens import approx_from
from lowtide.core.types import Usage
from lowtide.engine import budget, overview
from lowtide.engine.context import JobContext
from lowtide.engine.control import job_status
from lowtide.engine.dispatch import new_dispatch
from lowtide.engine.loader import load_job
from lowtide.store.payloads import payload_bytes, payload_chars, payload_text
from lowtide.store.schema import events, jobs, requests
from tests.conftest import make_spec, write_csv
from tests.engine.ledger_helpers import NOW
from tests.routes.conftest import KEY_ENV, _options

D = Decimal
MILLION = 1_000_000
OPENAI_BATCH = {"route": "openai-batch", "route_options": _options("openai-batch", "http://127.0.0.1:9")}  # never contacted
ANTHROPIC_BATCH = {"route": "anthropic-batch", "route_options": _options("anthropic-batch", "http://127.0.0.1:9")}
# OpenAI's images guide: gpt-4o bills a high-detail image 85 + 170 a 512-px tile, and an image
# is fit in 2048 x 2048, then its short side scaled to 768: 768 x 2048 at most, 2 x 4 tiles.
GPT_4O_IMAGE = 85 + 8 * 170
CONVERSATIONS = {"system": None, "user": None, "messages_column": "messages"}


@pytest.fixture(autouse=True)
def provider_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")


def _load(store, tmp_path, rows: list[dict], **spec) -> JobContext:
    load_job(store, make_spec(write_csv(tmp_path / "t.csv", rows), **spec), SystemClock())
    with store.begin() as conn:
        return JobContext.from_row(conn.execute(sa.select(jobs)).one())


def _text_tokens(conn) -> int:
    """The text approximation over every stored request (what the estimate counts as text)."""
    chars, nbytes = conn.execute(sa.select(sa.func.sum(payload_chars()), sa.func.sum(payload_bytes()))).one()
    return approx_from(int(chars), int(nbytes))


def _dispatch_all(conn, job: JobContext, route: str) -> int:
    """Every request of the job in one planned dispatch of `route`, as the planner leaves it."""
    d = new_dispatch(conn, job.id, route, "batch", DispatchState.PLANNED, NOW)
    conn.execute(requests.update().values(dispatch_id=d, state="dispatched", attempts=1))
    return d


def test_image_urls_are_estimated_at_the_most_an_image_costs_and_a_budget_below_that_sends_nothing(store, tmp_path):
    # An image by URL is some 60 characters of JSON (15 tokens by characters / 4) but is
    # billed up to 1,445 tokens on gpt-4o: estimated at its characters, a budgeted job of
    # image URLs spent about 50 times what it reserved for their input.
    rows = [{"ticket_id": f"T{i}", "body": "what is in it?", "img": f"https://example.com/photos/{i}.png"} for i in range(10)]
    job = _load(store, tmp_path, rows, model="gpt-4o", **OPENAI_BATCH, params={"max_tokens": 10}, budget_usd="100",
                template={"images": [{"column": "img", "detail": "high"}]})  # fmt: skip
    with store.begin() as conn:
        text = _text_tokens(conn)
        est = budget.estimate_requests(conn, job, requests.c.job_id == job.id, "openai-batch")
    billable = attempt_cost(Usage(input_tokens=text + 10 * GPT_4O_IMAGE, output_tokens=10 * 10), "gpt-4o", "openai-batch").usd
    assert est.input_tokens >= text + 10 * GPT_4O_IMAGE
    assert est.usd is not None and est.usd >= billable
    assert "10 image(s)" in est.note and "1,445" in est.note  # the dashboard shows what the bound assumes
    with store.begin() as conn:  # the dashboard's whole-job estimate is the same bound
        assert overview.job_estimate(conn, job.id).usd == est.usd

    # A budget the text alone fits but the images do not: nothing is sent.
    text_only = attempt_cost(Usage(input_tokens=text, output_tokens=100), "gpt-4o", "openai-batch").usd
    between = (text_only + billable) / 2
    spec = job.spec.model_copy(update={"budget_usd": between})
    with store.begin() as conn:
        conn.execute(jobs.update().values(spec=spec.model_dump_json()))
        job = JobContext.from_row(conn.execute(sa.select(jobs)).one())
        refused = budget.reserve(conn, job, _dispatch_all(conn, job, "openai-batch"), "openai-batch")
    assert refused is not None and "would pass the budget" in refused


def test_an_anthropic_image_is_estimated_at_claudes_largest_image(store, tmp_path):
    # Claude scales an image over 1,568 px or ~1,600 tokens down first (Anthropic's vision guide).
    rows = [{"ticket_id": f"T{i}", "body": "describe", "img": f"https://example.com/{i}.jpg"} for i in range(3)]
    job = _load(store, tmp_path, rows, model="claude-haiku-4-5", **ANTHROPIC_BATCH, params={"max_tokens": 10},
                budget_usd="100", template={"images": [{"column": "img"}]})  # fmt: skip
    with store.begin() as conn:
        text = _text_tokens(conn)
        est = budget.estimate_requests(conn, job, requests.c.job_id == job.id, "anthropic-batch")
    assert est.input_tokens == text + 3 * 1_600
    assert est.usd == attempt_cost(Usage(input_tokens=text + 3 * 1_600, output_tokens=30), "claude-haiku-4-5", "anthropic-batch").usd


def test_a_cached_system_prompt_is_estimated_at_the_one_hour_cache_write_rate(store, tmp_path):
    # anthropic-batch with `cache_prefix: true` marks every system prompt cache_control with
    # the 1-hour TTL: Anthropic bills that prefix at 2x input, the estimate priced it at 1x.
    rows = [{"ticket_id": f"T{i}", "body": "x" * 200} for i in range(5)]
    options = {**ANTHROPIC_BATCH["route_options"], "cache_prefix": True}
    job = _load(store, tmp_path, rows, model="claude-haiku-4-5", route="anthropic-batch", route_options=options,
                params={"max_tokens": 10}, budget_usd="100",
                template={"system": "You classify support tickets. " * 40, "user": "{{ body }}"})  # fmt: skip
    with store.begin() as conn:
        text = _text_tokens(conn)
        est = budget.estimate_requests(conn, job, requests.c.job_id == job.id, "anthropic-batch")
    # The provider's bill at its worst: every input token written to the cache, at the route's TTL.
    billable = attempt_cost(Usage(cache_write_tokens=text, output_tokens=50), "claude-haiku-4-5", "anthropic-batch", options).usd
    plain = attempt_cost(Usage(input_tokens=text, output_tokens=50), "claude-haiku-4-5", "anthropic-batch", options).usd
    assert billable > plain  # 2x input (the batch tier's 1.0 against 0.5 per million)
    assert est.usd == billable and est.cache_write_tokens == text
    assert "1-hour" in est.note

    # A budget the plain input fits but the cache writes do not: nothing is sent.
    spec = job.spec.model_copy(update={"budget_usd": (plain + billable) / 2})
    with store.begin() as conn:
        conn.execute(jobs.update().values(spec=spec.model_dump_json()))
        job = JobContext.from_row(conn.execute(sa.select(jobs)).one())
        refused = budget.reserve(conn, job, _dispatch_all(conn, job, "anthropic-batch"), "anthropic-batch")
    assert refused is not None and "would pass the budget" in refused


def test_a_rows_own_cache_control_with_a_one_hour_ttl_is_estimated_at_that_rate(store, tmp_path):
    # Rows that are conversations carry their own cache_control (ttl 1h) on a route without
    # cache_prefix: billed at the 1-hour write rate whatever the route's options say.
    def convo(i: int) -> str:
        block = {"type": "text", "text": f"ticket {i}: " + "y" * 400, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
        return json.dumps([{"role": "user", "content": [block]}])

    rows = [{"ticket_id": f"T{i}", "messages": convo(i), "mt": 20} for i in range(2)]
    rows.append({"ticket_id": "T9", "messages": json.dumps([{"role": "user", "content": "no cache here"}]), "mt": 20})
    job = _load(store, tmp_path, rows, model="claude-haiku-4-5", **ANTHROPIC_BATCH, params={"max_tokens": None},
                param_columns={"max_tokens": "mt"}, budget_usd="100", template=CONVERSATIONS)  # fmt: skip
    with store.begin() as conn:
        stored = conn.execute(sa.select(requests.c.custom_id, payload_text())).all()
        est = budget.estimate_requests(conn, job, requests.c.job_id == job.id, "anthropic-batch")
    cached = [p for cid, p in stored if cid != "T9"]
    plain = [p for cid, p in stored if cid == "T9"]
    writes = approx_from(sum(map(len, cached)), sum(len(p.encode()) for p in cached))
    uncached = approx_from(sum(map(len, plain)), sum(len(p.encode()) for p in plain))
    prices = load_catalog().lookup("anthropic", "claude-haiku-4-5")[1].batch
    billable = token_usd("anthropic", Usage(input_tokens=uncached, cache_write_tokens=writes, output_tokens=60), prices, "1h")
    assert est.usd is not None and est.usd >= billable
    assert est.cache_write_tokens == writes


def test_a_budgeted_request_carrying_a_pdf_is_never_sent_and_says_why(store, tmp_path):
    # A PDF is billed by its pages (each page's text and an image of it), which lowtide cannot
    # count before sending: a budget cannot bound it, so the dispatch is refused, as one with
    # no output limit is, and the job stops naming the cause and the fix.
    def convo(i: int) -> str:
        doc = {"type": "document", "source": {"type": "url", "url": f"https://example.com/{i}.pdf"}}
        return json.dumps([{"role": "user", "content": [doc, {"type": "text", "text": "summarise"}]}])

    rows = [{"ticket_id": f"T{i}", "messages": convo(i), "mt": 50} for i in range(2)]
    job = _load(store, tmp_path, rows, model="claude-haiku-4-5", **ANTHROPIC_BATCH, params={"max_tokens": None},
                param_columns={"max_tokens": "mt"}, budget_usd="100", template=CONVERSATIONS)  # fmt: skip
    with store.begin() as conn:
        refused = budget.reserve(conn, job, _dispatch_all(conn, job, "anthropic-batch"), "anthropic-batch")
        assert refused is not None and "2 request(s) hold a PDF or other file, billed by its pages, which lowtide cannot measure" in refused
        budget.exhaust(conn, job, refused, NOW)
        [why] = conn.scalars(sa.select(events.c.message).where(events.c.kind == "budget_exhausted"))
    assert job_status(store, "tickets").state == JobState.BUDGET_EXHAUSTED
    assert "price file" not in why and "without budget_usd" in why  # the fix that applies, not "add a price"


def test_a_budgeted_template_that_adds_a_pdf_to_every_request_is_refused_at_load(store, tmp_path):
    from lowtide.core.errors import SpecError

    rows = [{"ticket_id": "T1", "body": "summarise", "doc": "https://example.com/a.pdf"}]
    with pytest.raises(SpecError) as refused:
        _load(store, tmp_path, rows, model="claude-haiku-4-5", **ANTHROPIC_BATCH, params={"max_tokens": 10}, budget_usd="5",
              template={"files": [{"column": "doc"}]})  # fmt: skip
    assert "template.files" in str(refused.value) and "budget_usd" in str(refused.value)
    with store.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar() == 0  # nothing stored


def test_a_job_of_plain_text_is_estimated_as_before(store, tmp_path):
    rows = [{"ticket_id": f"T{i}", "body": "x" * 40} for i in range(4)]
    job = _load(store, tmp_path, rows, model="gpt-4o-mini", **OPENAI_BATCH, params={"max_tokens": 100}, budget_usd="5")
    with store.begin() as conn:
        text = _text_tokens(conn)
        est = budget.estimate_requests(conn, job, requests.c.job_id == job.id, "openai-batch")
    assert (est.input_tokens, est.output_tokens, est.note) == (text, 400, "")  # the common path, unchanged
    assert est.usd == (text * D("0.075") + 400 * D("0.30")) / MILLION
