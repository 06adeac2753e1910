"""The fault matrix: every HTTP fault kind of `lowtide serve --faults` (429 with Retry-After,
500, a delay past the client's timeout) on every endpoint the provider batch routes call,
and every job still ends with each request in the right terminal state, each chunk
submitted once and each result applied once.

One server per (route, endpoint): its plan answers the endpoint's 1st matching call with 429
+ Retry-After, the 2nd with 500, and delays the 3rd past the client's timeout; the 4th is
served normally. The SDKs retry reads twice on their own, create calls not at all (lowtide
turns them off so a create is never silently repeated), so each endpoint goes through both
the SDK's retries and lowtide's own (the next tick finds-or-submits, polls or downloads again).

Which calls reach which endpoint:

| endpoint | openai-batch | anthropic-batch |
|---|---|---|
| upload the input file | `POST /v1/files` | - |
| create a batch | `POST /v1/batches` | `POST /v1/messages/batches` |
| retrieve (poll; OpenAI also before a download) | `GET /v1/batches/{id}` | `GET /v1/messages/batches/{id}` |
| list (find a batch after a crash between create and recording its id) | `GET /v1/batches` | `GET /v1/messages/batches` |
| results | `GET /v1/files/{id}/content` | `GET /v1/messages/batches/{id}/results` |
| cancel (a cancelled job) | `POST /v1/batches/{id}/cancel` | `POST /v1/messages/batches/{id}/cancel` |

Batch-level faults (validation failure, expiry, dropped, duplicated and corrupt lines) are in
tests/routes/test_batch_routes.py::test_every_fault_kind_converges_to_the_right_terminal_states.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys

import pytest
import sqlalchemy as sa
import yaml

from lowtide.core.clock import SystemClock
from lowtide.engine.control import cancel_job, job_status
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.schema import dispatches, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import _options, _run
from tests.routes.test_batch_routes import KILL_AFTER_CREATE

ROWS = 12
CHUNK = 6
TIMEOUT = 5  # the client's timeout per call (seconds; generous: a busy machine must not time out normal calls) ...
DELAY = 8  # ... and the planned delay that runs past it

ENDPOINTS = {
    "openai-batch": {
        "upload": "POST /v1/files",
        "create": "POST /v1/batches",
        "retrieve": "GET /v1/batches/*",
        "list": "GET /v1/batches",
        "results": "GET /v1/files/*/content",
        "cancel": "POST /v1/batches/*/cancel",
    },
    "anthropic-batch": {
        "create": "POST /v1/messages/batches",
        "retrieve": "GET /v1/messages/batches/*",
        "list": "GET /v1/messages/batches",
        "results": "GET /v1/messages/batches/*/results",
        "cancel": "POST /v1/messages/batches/*/cancel",
    },
}
CASES = [(route, endpoint) for route, endpoints in ENDPOINTS.items() for endpoint in endpoints]


def fault_plan(match: str, first_call: int = 1) -> dict:
    """429 with Retry-After, then 500, then a delay past the client's timeout, on the calls
    numbered from `first_call` that match."""
    n = first_call
    return {
        "http": [
            {"match": match, "calls": [n], "status": 429, "retry_after": 1},
            {"match": match, "calls": [n + 1], "status": 500},
            {"match": match, "calls": [n + 2], "delay": DELAY},
        ]
    }


def provider_batches(route: str, url: str) -> list[tuple[str, str | None]]:
    """(id, lowtide key) of every batch the server holds, read through the official SDK."""
    if route == "openai-batch":
        import openai

        listed = openai.OpenAI(base_url=f"{url}/v1", api_key="k").batches.list(limit=100)
        return [(b.id, (b.metadata or {}).get("lowtide_key")) for b in listed]
    import anthropic

    return [(b.id, None) for b in anthropic.Anthropic(base_url=url, api_key="k").messages.batches.list(limit=100)]


def assert_each_chunk_once_and_each_result_once(store: Store, route: str, url: str) -> None:
    with store.begin() as conn:
        held = conn.execute(sa.select(dispatches.c.key, dispatches.c.provider_id).where(dispatches.c.kind == "batch")).all()
        twice = conn.execute(
            sa.text("SELECT request_id FROM attempts WHERE applied AND ok GROUP BY request_id HAVING COUNT(*) > 1")
        ).all()
    assert twice == []
    created = provider_batches(route, url)
    ids = [pid for _, pid in held if pid]
    assert len(ids) == len(set(ids)), "two dispatches hold one provider batch"
    assert sorted(b for b, _ in created) == sorted(ids), "the provider holds a batch no dispatch adopted"
    if route == "openai-batch":
        keys = collections.Counter(key for _, key in created)
        assert all(n == 1 for n in keys.values()), keys
        assert set(keys) == {key for key, pid in held if pid}


def start(serve, tmp_path, match: str, *extra: str, first_call: int = 1) -> str:
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump(fault_plan(match, first_call)))
    url = serve("--faults", str(plan), *extra)
    warm(url)
    return url


def warm(url: str) -> None:
    """One real-time call in each protocol, which no plan here matches: serve reads a
    protocol's SDK types at its first body (importing anthropic alone takes over a second of
    CPU), and a batch create that paid for that under a loaded machine's 5 s timeout would
    be a fault this matrix did not plan."""
    import anthropic
    import openai

    said = [{"role": "user", "content": "warm"}]
    openai.OpenAI(base_url=f"{url}/v1", api_key="k").chat.completions.create(model="m", messages=said)
    anthropic.Anthropic(base_url=url, api_key="k").messages.create(model="m", max_tokens=5, messages=said)


def load(tmp_path, route: str, url: str) -> tuple[Store, str]:
    source = write_csv(tmp_path / "t.csv", ticket_rows(ROWS))
    spec = make_spec(
        source,
        route=route,
        route_options=_options(route, url, max_requests=CHUNK, timeout=TIMEOUT),
        retry={"max_attempts": 4, "backoff_seconds": 0},
    )
    store_path = str(tmp_path / "client.db")
    store = Store(store_path)
    load_job(store, spec, SystemClock())
    return store, store_path


@pytest.mark.slow
@pytest.mark.parametrize(("route", "endpoint"), CASES)
def test_http_faults_on_every_endpoint_converge(route, endpoint, serve, tmp_path):
    match = ENDPOINTS[route][endpoint]
    if endpoint == "list":
        # The server's start-up probe is the 1st `GET /v1/batches`: the faults hit the next ones.
        url = start(serve, tmp_path, match, first_call=2 if route == "openai-batch" else 1)
        scenario_find_after_a_crash(route, url, tmp_path)
    elif endpoint == "cancel":
        # Twenty scaled hours (20 s): the batches are still in progress when the faulted cancel calls
        # get through.
        url = start(serve, tmp_path, match, "--complete-after", str(20 * 3600))
        scenario_cancel(route, url, tmp_path)
    else:
        url = start(serve, tmp_path, match)
        store, _ = load(tmp_path, route, url)
        status = _run(store, "tickets")
        assert status.counts == {"succeeded": ROWS}, status.events
        assert_each_chunk_once_and_each_result_once(store, route, url)
        with store.begin() as conn:
            outputs = dict(conn.execute(sa.select(requests.c.custom_id, requests.c.output)).all())
        assert outputs["T1003"] == "Ticket: ticket 1003 about shipping"
        if endpoint == "create":
            # Each faulted create came back to lowtide (no SDK retries on create) and was
            # found-or-submitted again by a later tick.
            assert sum(e.startswith("submit_error") for e in job_status(store, "tickets", events=50).events) >= 3


def scenario_find_after_a_crash(route: str, url: str, tmp_path) -> None:
    """A process dies between create and recording the id: the next one must find the batch
    through the faulted list endpoint and adopt it, not create another."""
    store, store_path = load(tmp_path, route, url)
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_CREATE, store_path], env=os.environ, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": ROWS}, status.events
    assert_each_chunk_once_and_each_result_once(store, route, url)
    events = job_status(store, "tickets", events=50).events
    assert any(e.startswith("find_error") for e in events), events  # the faults reached lowtide


def scenario_cancel(route: str, url: str, tmp_path) -> None:
    """A job cancelled while its batches are in progress: the cancel calls meet the faults,
    are made again by later polls, and every request ends succeeded (it had run before the
    cancel: echo answers at once) or cancelled; nothing is retried after the cancel."""
    store, _ = load(tmp_path, route, url)

    async def submit_all():
        async with Engine(store) as engine:
            for _ in range(20):  # a safety net: two chunks go out in the first tick or two
                await engine.tick("tickets")
                if job_status(store, "tickets").phases and sum(job_status(store, "tickets").phases.values()) == ROWS // CHUNK:
                    return
            raise AssertionError(job_status(store, "tickets"))

    asyncio.run(submit_all())
    cancel_job(store, "tickets", SystemClock())
    status = _run(store, "tickets")
    assert status.state == "cancelled"
    assert set(status.counts) <= {"succeeded", "cancelled"} and status.total == ROWS, status.counts
    assert_each_chunk_once_and_each_result_once(store, route, url)
    with store.begin() as conn:
        ended = dict(conn.execute(sa.select(dispatches.c.state, sa.func.count()).group_by(dispatches.c.state)).all())
        tries = conn.execute(sa.select(sa.func.max(requests.c.attempts))).scalar_one()
    assert ended == {"ended": ROWS // CHUNK}
    assert tries == 1  # cancelled requests were not sent again
    if route == "openai-batch":
        import openai

        statuses = {b.status for b in openai.OpenAI(base_url=f"{url}/v1", api_key="k").batches.list()}
    else:
        import anthropic

        statuses = {b.processing_status for b in anthropic.Anthropic(base_url=url, api_key="k").messages.batches.list()}
    assert statuses == ({"cancelled"} if route == "openai-batch" else {"ended"})


@pytest.mark.slow
@pytest.mark.parametrize("route", list(ENDPOINTS))
def test_a_job_cancelled_after_its_batch_completed_still_converges(route, serve, tmp_path):
    url = serve()
    source = write_csv(tmp_path / "t.csv", ticket_rows(CHUNK))
    spec = make_spec(source, route=route, route_options=_options(route, url, max_requests=CHUNK))
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())

    async def ticks(n: int) -> None:
        async with Engine(store) as engine:
            for _ in range(n):
                await engine.tick("tickets")
                await asyncio.sleep(0.3)  # let the next poll come due (poll_interval 0.05-0.2 s)

    async def submit() -> None:
        async with Engine(store) as engine:
            await engine.tick("tickets")  # plan and submit; the first poll is not due yet

    asyncio.run(submit())
    with store.begin() as conn:
        provider_id = conn.execute(sa.select(dispatches.c.provider_id)).scalar_one()
    for _ in range(600):  # a safety net: echo finishes a batch of 6 at once
        if _provider_status(route, url, provider_id) in ("completed", "ended"):
            break
        asyncio.run(asyncio.sleep(0.1))
    cancel_job(store, "tickets", SystemClock())  # the batch has already completed at the provider
    asyncio.run(ticks(10))
    status = job_status(store, "tickets")
    assert status.done, status.events
    assert status.counts == {"succeeded": CHUNK}


def _provider_status(route: str, url: str, batch_id: str) -> str:
    if route == "openai-batch":
        import openai

        return openai.OpenAI(base_url=f"{url}/v1", api_key="k").batches.retrieve(batch_id).status
    import anthropic

    return anthropic.Anthropic(base_url=url, api_key="k").messages.batches.retrieve(batch_id).processing_status
