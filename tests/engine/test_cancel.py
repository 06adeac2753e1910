"""Cancel from every state of a batch (issue 15, item 1), against `lowtide serve` (echo
backend) through the official SDKs: a create that failed transiently (`submitting`, nothing
at the provider), a create the provider took whose answer was lost (`submitting`, a batch
at the provider), and a cancel landing while a worker is inside the create call. Each time
`lowtide run` returns, every request ends in one terminal state, and a batch the provider
has is cancelled there and its results brought in."""

from __future__ import annotations

import asyncio

import anthropic
import openai
import pytest
import yaml

from lowtide.core.clock import SystemClock
from lowtide.core.errors import RouteError
from lowtide.core.states import DispatchState, JobState
from lowtide.engine.control import cancel_job, job_status, retry_job
from lowtide.engine.loader import load_job
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.routes.anthropic.batch import AnthropicBatchRoute
from lowtide.routes.openai.batch import OpenAIBatchRoute
from lowtide.store.schema import dispatches
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import ROUTES, _options, _run, serve  # noqa: F401  (the `serve` fixture)

CREATE = {"openai-batch": "POST /v1/batches", "anthropic-batch": "POST /v1/messages/batches"}
ROUTE_CLASS = {"openai-batch": OpenAIBatchRoute, "anthropic-batch": AnthropicBatchRoute}
RUN_TIMEOUT = 60  # a safety net: a cancelled job that never ends fails here instead of hanging


def _spec(tmp_path, route, url, n=6):
    source = write_csv(tmp_path / "t.csv", ticket_rows(n))
    return make_spec(source, route=route, route_options=_options(route, url))


def _provider(route, url) -> list[tuple[str, bool]]:
    """The provider's batches: (id, whether a cancel reached it)."""
    if route == "openai-batch":
        batches = openai.OpenAI(base_url=f"{url}/v1", api_key="k").batches.list(limit=100)
        return [(b.id, b.status in ("cancelling", "cancelled")) for b in batches]
    batches = anthropic.Anthropic(base_url=url, api_key="k").messages.batches.list(limit=100)
    return [(b.id, b.cancel_initiated_at is not None) for b in batches]


def _dispatch_states(store) -> list[str]:
    with store.begin() as conn:
        return list(conn.scalars(dispatches.select().with_only_columns(dispatches.c.state).order_by(dispatches.c.id)))


async def _drive(engine: Engine):
    return await asyncio.wait_for(drive(engine, "tickets"), RUN_TIMEOUT)


@pytest.mark.parametrize("route", ROUTES)
def test_cancel_after_a_transient_create_error_cancels_the_never_sent_batch(route, serve, store, tmp_path):  # noqa: F811
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"http": [{"match": CREATE[route], "first": 1, "status": 500}]}))
    url = serve("--faults", str(plan))
    spec = _spec(tmp_path, route, url)
    load_job(store, spec, SystemClock())

    async def first_tick():
        async with Engine(store) as engine:
            return await engine.tick("tickets")

    assert asyncio.run(first_tick()).submitted == 0  # the create got a 500: left `submitting`
    assert _dispatch_states(store) == [DispatchState.SUBMITTING]
    cancel_job(store, "tickets", SystemClock())
    status = _run(store, "tickets", timeout=RUN_TIMEOUT)  # returns: nothing is left in doubt
    assert (status.state, status.counts) == (JobState.CANCELLED, {"cancelled": 6})
    assert _dispatch_states(store) == [DispatchState.CANCELLED]
    assert _provider(route, url) == []  # `find` found nothing: it was never sent

    assert retry_job(store, "tickets", SystemClock(), failed=False, cancelled=True) == 6
    status = _run(store, "tickets", timeout=RUN_TIMEOUT)
    assert (status.state, status.counts) == (JobState.FINISHED, {"succeeded": 6})
    assert len(_provider(route, url)) == 1


def _lost_answer(route_name):
    class LostAnswer(ROUTE_CLASS[route_name]):
        """The provider takes the first create; its answer never reaches us."""

        lost = False

        async def submit(self, key, requests):
            batch_id = await super().submit(key, requests)
            if not self.lost:
                self.lost = True
                raise RouteError(f"{self.name}: connection reset while reading the answer")
            return batch_id

    return LostAnswer


@pytest.mark.parametrize("route", ROUTES)
def test_cancel_of_a_batch_created_but_not_recorded_adopts_it_and_cancels_it_at_the_provider(route, serve, store, tmp_path):  # noqa: F811
    url = serve("--complete-after", "36000")  # ten real seconds: the batch is still running when cancelled
    spec = _spec(tmp_path, route, url)
    load_job(store, spec, SystemClock())

    async def go():
        route_obj = _lost_answer(route)(_options(route, url))
        try:
            async with Engine(store, routes={route: route_obj}) as engine:
                assert (await engine.tick("tickets")).submitted == 0
                assert _dispatch_states(store) == [DispatchState.SUBMITTING] and len(_provider(route, url)) == 1
                cancel_job(store, "tickets", SystemClock())
                return await _drive(engine)
        finally:
            await route_obj.aclose()

    status = asyncio.run(go())
    assert status.state == JobState.CANCELLED and status.total == 6
    assert set(status.counts) <= {"cancelled", "succeeded"}  # what the provider finished first is kept
    [(batch_id, cancelled)] = _provider(route, url)
    # Adopted through `find`, then cancelled there. An Anthropic batch shows whose it is only
    # once it has ended (docs/batch-routes.md): it is adopted then, and never cancelled, as it
    # could be another client's.
    assert cancelled == (route != "anthropic-batch")
    with store.begin() as conn:
        [(state, provider_id)] = conn.execute(dispatches.select().with_only_columns(dispatches.c.state, dispatches.c.provider_id)).all()
    assert (state, provider_id) == (DispatchState.ENDED, batch_id)


def _held_create(route_name):
    class HeldCreate(ROUTE_CLASS[route_name]):
        """The first create waits for the test's go-ahead (a worker inside `route.submit`)."""

        def __init__(self, options):
            super().__init__(options)
            self.inside = asyncio.Event()
            self.go = asyncio.Event()

        async def submit(self, key, requests):
            if not self.inside.is_set():
                self.inside.set()
                await self.go.wait()
            return await super().submit(key, requests)

    return HeldCreate


@pytest.mark.parametrize("route", ROUTES)
def test_a_cancel_landing_during_the_create_call_is_honoured_when_the_id_is_recorded(route, serve, store, tmp_path):  # noqa: F811
    url = serve("--complete-after", "36000")
    spec = _spec(tmp_path, route, url)
    load_job(store, spec, SystemClock())

    async def go():
        route_obj = _held_create(route)(_options(route, url))
        try:
            async with Engine(store, routes={route: route_obj}) as engine:
                tick = asyncio.create_task(engine.tick("tickets"))
                await route_obj.inside.wait()
                cancel_job(store, "tickets", SystemClock())  # `lowtide cancel`, while the create is on its way
                route_obj.go.set()
                assert (await tick).submitted == 1
                return await _drive(engine)
        finally:
            await route_obj.aclose()

    status = asyncio.run(go())
    assert status.state == JobState.CANCELLED and status.total == 6
    assert set(status.counts) <= {"cancelled", "succeeded"}
    [(_, cancelled)] = _provider(route, url)
    assert cancelled  # the cancel reached the provider: the batch was not left to run and bill
    assert job_status(store, "tickets").phases == {}
