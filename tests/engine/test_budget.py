"""Budgets: a job never sends a batch or a direct dispatch its estimate says could pass its
`budget_usd`; it stops (`budget_exhausted`), still collects what is in flight, and resumes
when its spec is submitted again with a bigger budget.

The batch route is the real `openai-batch` route (the official SDK) against `lowtide serve`;
the direct route is `echo` answering under the name of the `openai` route (this tree has no
real-time OpenAI route to run offline), priced as OpenAI real time.
"""

from __future__ import annotations

import asyncio
import json
import math
from decimal import Decimal

import pytest
import sqlalchemy as sa

from lowtide.core.clock import SystemClock
from lowtide.core.spec import build_spec
from lowtide.core.states import DispatchState, JobState
from lowtide.core.tokens import approx_from
from lowtide.core.types import Request
from lowtide.engine import budget
from lowtide.engine.context import JobContext
from lowtide.engine.control import cancel_job, job_status
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.routes.own.echo import EchoRoute
from lowtide.store.money import from_pico
from lowtide.store.payloads import payload_text
from lowtide.store.queries import save_job
from lowtide.store.schema import attempts, dispatches, events, jobs, requests
from tests.conftest import make_spec, write_csv
from tests.embeddings.helpers import docs_csv, embed_spec
from tests.engine.ledger_helpers import NOW, stored_job
from tests.routes.conftest import KEY_ENV, _options, _run, serve  # noqa: F401  (the `serve` fixture)

D = Decimal
MILLION = 1_000_000


def _spent(store, name: str = "tickets") -> Decimal:
    with store.begin() as conn:
        total = conn.execute(
            sa.select(sa.func.sum(attempts.c.cost_picousd)).join(jobs, jobs.c.id == attempts.c.job_id).where(jobs.c.name == name)
        ).scalar()
    return from_pico(total or 0)


def _events(store, kind: str) -> list[str]:
    with store.begin() as conn:
        return list(conn.scalars(sa.select(events.c.message).where(events.c.kind == kind).order_by(events.c.id)))


def _payload_chars(store) -> list[int]:
    with store.begin() as conn:
        return [len(p) for p in conn.scalars(sa.select(payload_text().label("payload")))]


def test_a_batch_job_stops_before_its_budget_collects_what_is_in_flight_and_resumes(serve, store, tmp_path):  # noqa: F811
    # Batches take 2 real seconds: the third chunk is due while the first two are still in
    # flight at their reserved (not yet their real, smaller) cost.
    url = serve("--complete-after", "7200")
    rows = [{"ticket_id": f"T{1000 + i}", "body": f"ticket number {1000 + i}"} for i in range(20)]  # equal lengths
    source = write_csv(tmp_path / "t.csv", rows)

    def spec(budget_usd):
        return make_spec(
            source, model="gpt-4o-mini", route="openai-batch", route_options=_options("openai-batch", url),
            chunk_size=5, params={"max_tokens": 100}, budget_usd=budget_usd,
        )  # fmt: skip

    # One batch of 5: input ≈ characters / 4 at 0.075, output 5 × max_tokens at 0.30 (per M).
    load_job(store, spec("1"), SystemClock())
    [chars] = set(_payload_chars(store))
    chunk = (D(math.ceil(5 * chars / 4)) * D("0.075") + 500 * D("0.30")) / MILLION
    allowed = chunk * D("2.5")  # two batches fit, a third does not
    load_job(store, spec(str(allowed)), SystemClock())

    status = _run(store, "tickets")
    assert status.state == JobState.BUDGET_EXHAUSTED
    assert status.counts == {"succeeded": 10, "pending": 10}  # both batches in flight were collected
    with store.begin() as conn:
        sent = conn.execute(sa.select(dispatches.c.state, dispatches.c.reserved_picousd).where(dispatches.c.provider_id.is_not(None))).all()
        unsent = conn.execute(sa.select(sa.func.count()).where(dispatches.c.provider_id.is_(None))).scalar_one()
        tries = set(conn.scalars(sa.select(requests.c.attempts).where(requests.c.state == "pending")))
    assert [(s, from_pico(r)) for s, r in sent] == [(DispatchState.ENDED, chunk)] * 2
    assert unsent >= 1 and tries == {0}  # planned batches were taken apart: no attempt counted
    assert 0 < _spent(store) <= allowed
    assert status.spent_usd == _spent(store) and status.reserved_usd == 0 and status.budget_usd == allowed
    [why] = _events(store, "budget_exhausted")
    assert f"+ ${chunk.normalize():f} estimated for the next 5 request(s) on openai-batch would pass the budget of ${allowed.normalize():f}" in why
    assert why.endswith("Raise budget_usd in the spec and run `lowtide submit` with it to resume")

    # Nothing moves while exhausted; submitting the spec with a bigger budget resumes it.
    assert asyncio.run(_tick(store)) == 0
    load_job(store, spec("1"), SystemClock())
    assert _events(store, "budget_resumed") == ["spec submitted again with a budget of $1: sending again"]
    status = _run(store, "tickets")
    assert (status.state, status.counts) == (JobState.FINISHED, {"succeeded": 20})
    assert status.spent_usd == _spent(store) < D(1)


async def _tick(store) -> int:
    async with Engine(store) as engine:
        return (await engine.tick("tickets")).submitted


class PricedEcho(EchoRoute):
    """`echo`, answering as the `openai` route (and so priced as OpenAI real time)."""

    name = "openai"


def _drive(store, clock, budget_usd: Decimal | None = None, ticks: int = 20):
    """Tick the job (a fresh engine each time); return, per tick, (spent, reserved) before
    it and whether the tick sent anything."""
    seen = []

    async def go():
        async with Engine(store, clock, routes={"openai": PricedEcho({"dispatch_size": 2})}) as engine:
            for _ in range(ticks):
                with store.begin() as conn:
                    job_id = conn.execute(sa.select(jobs.c.id)).scalar_one()
                    before = budget.position(conn, job_id)
                report = await engine.tick("tickets")
                seen.append((before.spent, report.ingested.succeeded))
                clock.advance(1)

    asyncio.run(go())
    return seen


def test_a_direct_dispatch_over_the_budget_is_never_run(store, tmp_path, clock):
    job = stored_job(store, tmp_path, n=6, model="gpt-4o-mini", route="openai", params={"max_tokens": 16}, budget_usd="0.00001")
    # Two requests per dispatch: input ≈ characters / 4 at 0.15, output 2 × 16 at 0.60 (per M).
    chars = sum(sorted(_payload_chars(store))[:2])
    estimate = (D(math.ceil(chars / 4)) * D("0.15") + 32 * D("0.60")) / MILLION
    assert estimate > D("0.00001")

    assert _drive(store, clock, ticks=2) == [(0, 0), (0, 0)]
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(attempts)).scalar_one() == 0
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar_one() == 0  # the claim was undone
        assert set(conn.scalars(sa.select(requests.c.attempts))) == {0}
    status = job_status(store, "tickets")
    assert (status.state, status.counts) == (JobState.BUDGET_EXHAUSTED, {"pending": 6})
    assert _events(store, "budget_exhausted") == [
        f"stopped sending: $0 spent + $0 reserved + ${estimate.normalize():f} estimated for the next 2 request(s) on openai "
        "would pass the budget of $0.00001. Raise budget_usd in the spec and run `lowtide submit` with it to resume"
    ]

    # Raised so that each dispatch's estimate fits only while what was spent leaves room.
    raised = estimate * D("1.5")
    spec = job.spec.model_copy(update={"budget_usd": raised})
    with store.begin() as conn:
        save_job(conn, spec.name, spec.model_dump_json(), spec.route, NOW)
        assert budget.resume(conn, job.id, spec.budget_usd, NOW)
    ticks = _drive(store, clock, ticks=6)
    for spent, ran in ticks:  # a dispatch ran only where its estimate fitted beside what was spent
        assert (spent + estimate <= raised) == bool(ran), ticks
    assert _spent(store) <= raised
    status = job_status(store, "tickets")
    assert (status.state, status.counts) == (JobState.BUDGET_EXHAUSTED, {"succeeded": 4, "pending": 2})
    # two dispatches of two requests; echo's usage: 40 characters / 4 in, the same 40 back out
    assert status.spent_usd == 2 * 2 * (10 * D("0.15") + 10 * D("0.60")) / MILLION

    assert cancel_job(store, "tickets", clock) == 2  # an exhausted job can still be cancelled
    assert job_status(store, "tickets").state == JobState.CANCELLED


def test_a_budgeted_job_sends_nothing_it_cannot_price(store, tmp_path):
    job = stored_job(store, tmp_path, n=2, model="gpt-9-turbo", route="openai-batch", budget_usd="5")
    with store.begin() as conn:
        from lowtide.engine.dispatch import new_dispatch

        d = new_dispatch(conn, job.id, "openai-batch", "batch", DispatchState.PLANNED, NOW)
        conn.execute(requests.update().values(dispatch_id=d, state="dispatched", attempts=1))
        refused = budget.reserve(conn, job, d, "openai-batch")
        assert refused == (
            'the cost of 2 request(s) on openai-batch cannot be estimated (openai model "gpt-9-turbo" is not in the price '
            "catalog; add it under `openai:` in a price file (docs/costs.md)); a budgeted job sends nothing it cannot price"
        )
        budget.exhaust(conn, job, refused, NOW)
        states = conn.execute(sa.select(dispatches.c.state)).scalars().all()
        reqs = conn.execute(sa.select(requests.c.state, requests.c.attempts, requests.c.dispatch_id)).all()
    assert states == [DispatchState.CANCELLED]
    assert set(reqs) == {("pending", 0, None)}
    assert job_status(store, "tickets").state == JobState.BUDGET_EXHAUSTED


def test_a_job_without_a_budget_reserves_nothing(store, tmp_path):
    job = stored_job(store, tmp_path, n=1, model="gpt-4o-mini", route="openai-batch")
    with store.begin() as conn:
        assert budget.reserve(conn, job, 12345, "openai-batch") is None


def test_a_direct_claim_takes_at_most_the_routes_dispatch_size(store, tmp_path):
    """What a dispatch's estimate covers is what it claimed; on PostgreSQL the claim once
    took every due request (the planner ran its LIMIT subquery once per row)."""
    from lowtide.engine.dispatch import claim_due, new_dispatch

    job = stored_job(store, tmp_path, n=6, model="gpt-4o-mini", route="openai")
    with store.begin() as conn:
        d = new_dispatch(conn, job.id, "openai", "direct", DispatchState.RUNNING, NOW)
        assert claim_due(conn, d, job.id, NOW, 2, "openai") == 2
        assert conn.execute(sa.select(sa.func.count()).where(requests.c.dispatch_id == d)).scalar_one() == 2


def test_a_budget_on_a_route_with_no_price_list_is_refused_at_load_naming_why(store, tmp_path, monkeypatch):
    """digitalocean-batch has no price list anywhere (its card's billing is None): a budgeted
    job there is refused before anything is stored, as any unpriceable job is, never an
    AssertionError (the simulation's `budget` rule found it)."""
    from lowtide.core.errors import SpecError
    from lowtide.core.pricing import attempt_cost
    from lowtide.core.types import Usage

    cost = attempt_cost(Usage(input_tokens=1, output_tokens=1), "openai-gpt-4o-mini", "digitalocean-batch")
    assert cost.usd is None and "digitalocean-batch has no price list" in cost.note
    monkeypatch.setenv("MODEL_ACCESS_KEY", "k")
    write_csv(tmp_path / "t.csv", [{"ticket_id": "1", "body": "x"}])
    spec = make_spec(tmp_path / "t.csv", route="digitalocean-batch", model="openai-gpt-4o-mini", budget_usd="5",
                     route_options={"base_url": "http://127.0.0.1:9"})  # fmt: skip
    with pytest.raises(SpecError) as refused:
        load_job(store, spec, clock=SystemClock())
    assert "has no price (digitalocean-batch has no price list" in str(refused.value)
    assert str(refused.value).endswith("Remove budget_usd, or send through a priced route")
    with store.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar() == 0



def test_a_dispatch_of_japanese_text_is_estimated_at_more_than_a_token_a_character(store, tmp_path):
    # Characters / 4 estimated 520 Japanese characters at 130 tokens; cl100k_base and Claude's
    # tokenizers count about 520 (tests/core/test_token_approximation.py), so a budget held
    # against the estimate let a job of such text spend about four times what it reserved.
    job = stored_job(store, tmp_path, n=2, model="gpt-4o-mini", route="openai", params={"max_tokens": 16}, budget_usd="1")
    text = "注文した商品が二日遅れて届き、箱が破損していました。" * 20  # 520 characters
    body = Request.chat("r", "gpt-4o-mini", [{"role": "user", "content": text}], max_tokens=16).to_payload()
    with store.begin() as conn:
        conn.execute(sa.update(requests).values(payload=json.dumps(body, ensure_ascii=False), head_id=None))  # whole, UTF-8
        stored = list(conn.scalars(sa.select(payload_text().label("payload"))))
        est = budget.estimate_requests(conn, job, requests.c.job_id == job.id, "openai")
    assert est.input_tokens >= 2 * len(text) * 1.25  # before: a quarter of that
    assert est.input_tokens == approx_from(sum(map(len, stored)), sum(len(p.encode()) for p in stored))


@pytest.fixture
def provider_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")


BATCH = {"route": "openai-batch", "route_options": _options("openai-batch", "http://127.0.0.1:9")}  # never contacted


def _loaded_estimate(store, tmp_path, rows: list[dict], **spec) -> budget.Estimate:
    """The estimate of a job loaded from `rows` (the loader's own stored bodies), all its
    requests, on openai-batch."""
    return _estimate_of(store, make_spec(write_csv(tmp_path / "t.csv", rows), model="gpt-4o-mini", **BATCH, **spec))


def _estimate_of(store, spec) -> budget.Estimate:
    load_job(store, spec, SystemClock())
    with store.begin() as conn:
        job = JobContext.from_row(conn.execute(sa.select(jobs)).one())
        return budget.estimate_requests(conn, job, requests.c.job_id == job.id, "openai-batch")


@pytest.mark.usefixtures("provider_key")
def test_a_request_asking_n_answers_is_estimated_at_n_times_its_output_limit(store, tmp_path):
    # The provider bills every answer n asks for: estimated at one answer each, a budgeted
    # job with n: 8 spent 1.5 times its budget.
    rows = [{"ticket_id": f"T{i}", "body": "x" * 40} for i in range(3)]
    est = _loaded_estimate(store, tmp_path, rows, params={"max_tokens": 100, "n": 8}, budget_usd="5")
    assert est.output_tokens == 3 * 8 * 100


@pytest.mark.usefixtures("provider_key")
def test_a_rows_own_output_limit_from_param_columns_is_what_its_request_is_estimated_at(store, tmp_path):
    # params.max_tokens (5) is what a row without a cell gets; the rows' cells are what is
    # sent: estimated at the spec's 5, a budgeted job spent 3 times its budget.
    rows = [{"ticket_id": f"T{i}", "body": "x" * 40, "mt": mt} for i, mt in enumerate((500, 50, 7))]
    est = _loaded_estimate(store, tmp_path, rows, params={"max_tokens": 5}, param_columns={"max_tokens": "mt"}, budget_usd="5")
    assert est.output_tokens == 500 + 50 + 7


@pytest.mark.usefixtures("provider_key")
def test_a_budget_takes_rows_that_bring_their_only_output_limit(store, tmp_path):
    # Every row's limit in its own cell, none in params: the spec was refused ("budget_usd
    # needs an output limit"), though each request is estimated at its own limit.
    rows = [{"ticket_id": f"T{i}", "body": "x" * 40, "mt": mt} for i, mt in enumerate((300, 20))]
    est = _loaded_estimate(store, tmp_path, rows, params={"max_tokens": None}, param_columns={"max_tokens": "mt"}, budget_usd="5")
    assert (est.output_tokens, est.note) == (300 + 20, "")


@pytest.mark.usefixtures("provider_key")
def test_a_rows_own_n_from_param_columns_multiplies_its_output_limit(store, tmp_path):
    rows = [{"ticket_id": f"T{i}", "body": "x" * 40, "n": n} for i, n in enumerate((1, 4))]
    est = _loaded_estimate(store, tmp_path, rows, params={"max_tokens": 10}, param_columns={"n": "n"}, budget_usd="5")
    assert est.output_tokens == 10 + 4 * 10


def test_the_answers_a_body_asks_for_are_n_or_geminis_candidate_count():
    def bound(body: dict) -> int | None:
        return Request("r", "/v1/chat/completions", body).output_bound

    assert bound({"max_tokens": 100}) == 100
    assert bound({"max_tokens": 100, "n": 3}) == 300
    assert bound({"generationConfig": {"maxOutputTokens": 50, "candidateCount": 4}}) == 200
    assert bound({"n": 3}) is None  # no limit: no bound


@pytest.mark.usefixtures("provider_key")
def test_an_embedding_job_with_a_budget_is_estimated_at_its_input_alone_and_sent(store, tmp_path):
    # An embedding bills no output tokens: estimated as unbounded, a budgeted embedding job
    # never sent anything, and the advice (give every row max_tokens) failed at the provider.
    est = _estimate_of(store, build_spec(embed_spec(docs_csv(tmp_path / "d.csv", 4), **BATCH, budget_usd="5")))
    assert (est.requests, est.output_tokens, est.note) == (4, 0, "")
    assert est.usd == est.input_tokens * D("0.01") / MILLION  # text-embedding-3-small's batch price
