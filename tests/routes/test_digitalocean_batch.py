"""digitalocean-batch: jobs through `lowtide serve` speaking DigitalOcean's batch inference API
(under `/digitalocean`, server/digitalocean_api.py: a file intent, a presigned upload,
request_id idempotency, download links), the official pydo SDK on both sides; a refused row
fails alone; a crash between create and recording the id adopts the batch by its
request_id; a missing key and Anthropic-shaped requests are refused before anything is
stored; the key is never kept."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import httpx
import pytest
import sqlalchemy as sa
import yaml
from azure.core.exceptions import HttpResponseError
from pydo.inference.aio import Client

from lowtide.core.cards import CARDS
from lowtide.core.clock import SystemClock
from lowtide.core.errors import InputError
from lowtide.core.types import Request
from lowtide.engine.loader import load_job
from lowtide.routes.digitalocean.batch import NAME, create
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches, events, jobs, requests
from tests.conftest import make_spec, ticket_rows, whole_columns, write_csv
from tests.routes.conftest import KEY_ENV, _run
from tests.routes.test_batch_routes import KILL_AFTER_CREATE

KEY = "dop-" + "Zk4wT8nB3q" * 3  # long enough to be scrubbed (routes/base.py secret_of)
CHAT = "/v1/chat/completions"
MODEL = "openai-gpt-4o-mini"


@pytest.fixture(autouse=True)
def no_provider_env(monkeypatch):
    monkeypatch.delenv("MODEL_ACCESS_KEY", raising=False)


def _options(url: str, **more) -> dict:
    return {
        "base_url": f"{url}/digitalocean",
        "api_key_env": KEY_ENV,
        "poll_interval": [0.05, 0.2],
        **more,
    }


def _listed(url: str, key: str = KEY) -> list[dict]:
    async def go():
        client = Client(token=key, inference_endpoint=f"{url}/digitalocean", retry_total=0)
        try:
            return (await client.inference.list_batches(limit=100, enforce_https=False))["data"]
        finally:
            await client.close()

    return asyncio.run(go())


def _load(tmp_path, url: str, n: int, **spec) -> Store:
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(n)), route=NAME, model=MODEL,
                     route_options=spec.pop("route_options", _options(url)), **spec)  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    return store


def test_a_job_runs_through_digitaloceans_batch_api_and_a_refused_row_fails_alone(
    serve, tmp_path, monkeypatch
):
    url = serve("--api-key", KEY, "--option", "reject=[T1003]")  # the echo backend refuses one row
    monkeypatch.setenv(KEY_ENV, KEY)
    store = _load(tmp_path, url, 12, route_options=_options(url, max_requests=5))
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 11, "failed": 1}
    with store.begin() as conn:
        rows = {r.custom_id: r for r in conn.execute(sa.select(*whole_columns(requests)))}
        keys = dict(conn.execute(sa.select(dispatches.c.provider_id, dispatches.c.key)).all())
    assert (
        rows["T1004"].output == "Ticket: ticket 1004 about feedback"
    )  # echo, matched by custom_id
    assert (
        rows["T1003"].state == "failed"
        and "rejected by route_options.reject" in rows["T1003"].error_message
    )
    # What DigitalOcean would hold: 3 batches (5 + 5 + 2), each created with its dispatch's key as request_id.
    listed = _listed(url)
    assert {b["batch_id"]: b["request_id"] for b in listed} == keys
    assert {(b["status"], b["provider"], b["endpoint"]) for b in listed} == {
        ("completed", "openai", CHAT)
    }
    assert sum(b["request_counts"]["total"] for b in listed) == 12
    with pytest.raises(HttpResponseError) as refused:
        _listed(url, "wrong-key")
    assert refused.value.status_code == 401


def test_sigkill_between_create_and_recording_the_id_adopts_the_batch_by_its_request_id(
    serve, tmp_path
):
    url = serve()
    store_path = str(tmp_path / "client.db")
    _load(tmp_path, url, 6)
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_CREATE, store_path], env=os.environ, capture_output=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    assert len(_listed(url)) == 1  # created, its id never recorded

    status = _run(Store(store_path), "tickets")
    assert status.counts == {"succeeded": 6}
    assert len(_listed(url)) == 1  # found by its request_id and adopted, not created again
    with Store(store_path).begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar_one() == 1


def test_a_create_repeating_a_request_id_answers_the_batch_it_made(serve, monkeypatch):
    url = serve()
    monkeypatch.setenv(KEY_ENV, KEY)
    route = create(_options(url))
    line = [Request("a", CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})]

    async def twice() -> tuple[str, str]:
        try:
            return await route.submit("k-1", line), await route.submit("k-1", line)
        finally:
            await route.aclose()

    first, second = asyncio.run(twice())
    assert first == second and len(_listed(url)) == 1


@pytest.mark.parametrize(
    ("options", "endpoint", "words"),
    [
        ({}, CHAT, ("no API key", "MODEL_ACCESS_KEY", "route_options.api_key_env")),
        ({"api_key_env": KEY_ENV, "max_requests": 50_001}, CHAT, ("give at most 50,000",)),
        ({"api_key_env": KEY_ENV}, "/v1/messages", ("Anthropic-shaped", "anthropic-batch", NAME)),
    ],
)
def test_bad_input_is_refused_before_anything_is_stored(
    options, endpoint, words, tmp_path, monkeypatch
):
    monkeypatch.setenv(KEY_ENV, KEY)
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3)), route=NAME, model=MODEL, route_options=options,
                     endpoint=endpoint)  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    with pytest.raises(InputError) as refused:  # a spec's or its rows'
        load_job(store, spec, SystemClock())
    said = str(refused.value)
    assert all(w in said for w in words) and KEY not in said, said
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0
        assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar_one() == 0


def test_the_key_is_never_stored_or_logged(serve, tmp_path, monkeypatch, caplog):
    # a create answered 500 and polls answered 500 with the key in the message, as a proxy that echoes its headers might
    echoed = f"bad header authorization: Bearer {KEY}"
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"http": [{"match": "POST /digitalocean/v1/batches", "first": 1, "status": 500, "message": echoed},
                                             {"match": "GET /digitalocean/v1/batches/*", "first": 2, "status": 500, "message": echoed}]}))  # fmt: skip
    url = serve("--api-key", KEY, "--faults", str(plan))
    monkeypatch.setenv(KEY_ENV, KEY)
    caplog.set_level("DEBUG")
    store = _load(tmp_path, url, 4, retry={"max_attempts": 3, "backoff_seconds": 0})
    status = _run(store, "tickets", timeout=120)
    assert status.counts == {"succeeded": 4}
    with store.begin() as conn:
        stored = repr(
            [
                tuple(r)
                for t in (jobs, requests, attempts, dispatches, events)
                for r in conn.execute(sa.select(t))
            ]
        )
        kinds = set(conn.scalars(sa.select(events.c.kind)))
    assert {
        "submit_error",
        "poll_error",
    } <= kinds and "[api key]" in stored  # the errors were kept, scrubbed
    assert KEY not in stored and KEY not in caplog.text
    for path in tmp_path.glob("client.db*"):  # the database's own bytes, its WAL too
        assert KEY.encode() not in path.read_bytes(), path


def test_serve_signs_its_presigned_urls_and_the_route_defaults_to_digitalocean(serve, monkeypatch):
    url = serve()
    assert (
        httpx.put(
            f"{url}/digitalocean/presigned/x?expires=9999999999&signature=forged", content=b"{}"
        ).status_code
        == 403
    )
    monkeypatch.setenv("MODEL_ACCESS_KEY", KEY)
    route = create({})
    assert (
        route.base_url == "https://inference.do-ai.run"
        and route.limits.max_requests == CARDS[NAME].limits.max_requests
    )
    asyncio.run(route.aclose())
