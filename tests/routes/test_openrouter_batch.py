"""openrouter-batch: jobs through `lowtide serve` speaking OpenRouter's Batch API (inline
requests at /api/v1/batches, results in GET /batches/{id}), the official `openrouter` SDK on
both sides at its defaults; a crash between create and recording the id adopts the batch (no
metadata: matched by size and window, proven by its custom_ids); inline images, endpoints
OpenRouter does not batch and a missing key are refused before anything is stored."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys

import httpx
import openrouter
import pytest
import sqlalchemy as sa
import yaml
from openrouter import errors

from lowtide.core.clock import SystemClock
from lowtide.core.errors import InputError, RouteError, SpecError
from lowtide.core.spec import JobSpec
from lowtide.engine.loader import load_job
from lowtide.routes.openrouter.batch import NAME, create
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches, events, jobs, requests
from tests.conftest import make_spec, ticket_rows, whole_columns, write_csv
from tests.routes.conftest import KEY_ENV, _run
from tests.routes.test_batch_routes import KILL_AFTER_CREATE

KEY = "sk-or-v1-" + "Qm7pR2sV9x" * 3


@pytest.fixture(autouse=True)
def no_provider_env(monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)


def _options(url: str, **more) -> dict:
    # serve's clock runs 3600x fast, so its creation times run ahead of ours: a wide window.
    return {
        "base_url": f"{url}/api/v1",
        "api_key_env": KEY_ENV,
        "poll_interval": [0.05, 0.2],
        "find_window": 10**7,
        **more,
    }


def _sdk(url: str, key: str = KEY) -> openrouter.OpenRouter:
    return openrouter.OpenRouter(api_key=key, server_url=f"{url}/api/v1")


def _all(client: openrouter.OpenRouter) -> list:
    page, found = client.batch.list(limit=100), []
    while page is not None:
        found += page.result.data
        page = page.next()
    return found


def test_a_job_runs_through_serve_and_a_refused_row_fails_alone(serve, tmp_path, monkeypatch):
    url = serve("--api-key", KEY, "--option", "reject=[T1003]")  # the echo backend refuses one row
    monkeypatch.setenv(KEY_ENV, KEY)
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(12)), route=NAME, model="meta-llama/llama-3.3-70b-instruct",
                     route_options=_options(url, max_requests=5, provider_only=["deepinfra"]))  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 11, "failed": 1}
    with store.begin() as conn:
        rows = {r.custom_id: r for r in conn.execute(sa.select(*whole_columns(requests)))}
        provider_ids = conn.execute(sa.select(dispatches.c.provider_id)).scalars().all()
    assert (
        rows["T1004"].output == "Ticket: ticket 1004 about feedback"
    )  # echo, matched by custom_id
    assert (
        rows["T1003"].state == "failed"
        and "rejected by route_options.reject" in rows["T1003"].error_message
    )
    assert (
        json.loads(rows["T1004"].response)["object"] == "chat.completion"
    )  # the whole answer kept
    # What OpenRouter would hold: 3 batches (5 + 5 + 2) of one model and endpoint, read back by the SDK.
    client = _sdk(url)
    batches = _all(client)
    assert sorted(b.id for b in batches) == sorted(provider_ids) and {
        b.status for b in batches
    } == {"completed"}
    assert {b.model for b in batches} == {"meta-llama/llama-3.3-70b-instruct"} and {
        b.endpoint for b in batches
    } == {"/v1/chat/completions"}
    assert all(b.results is None for b in batches)  # a list item omits results
    full = [client.batch.get_batches(id=b.id) for b in batches]
    assert sorted(r.custom_id for b in full for r in b.results) == sorted(rows)
    refused = next(r for b in full for r in b.results if r.custom_id == "T1003")
    assert refused.response is None and refused.error.type == "invalid_request_error"
    assert (
        sum(b.request_counts.failed for b in full) == 1
        and sum(b.request_counts.total for b in full) == 12
    )
    client.batch.delete(id=full[0].id)  # an ended batch may be deleted
    assert len(_all(client)) == 2
    with pytest.raises(errors.OpenRouterError) as wrong:
        _sdk(url, "wrong-key").batch.get_batches(id=full[1].id)
    assert wrong.value.status_code == 401
    _check_create_refusals(url)


def _check_create_refusals(url: str) -> None:
    """serve refuses `requests` before `endpoint` and `model`, and a body naming another model, as OpenRouter does."""

    def post(body):
        return httpx.post(
            f"{url}/api/v1/batches",
            content=body,
            headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"},
        )

    first = post(
        b'{"requests": [{"custom_id": "a", "body": {"messages": []}}], "endpoint": "/v1/chat/completions", "model": "m"}'
    )
    assert (
        first.status_code == 400
        and "before `requests`" in first.json()["error"]["message"]
        and first.json()["error"]["code"] == 400
    )
    other = post(json.dumps({"endpoint": "/v1/chat/completions", "model": "m",
                             "requests": [{"custom_id": "a", "body": {"model": "n", "messages": []}}]}).encode())  # fmt: skip
    assert (
        other.status_code == 400
        and "differs from the batch's model" in other.json()["error"]["message"]
    )
    ok = post(json.dumps({"endpoint": "/v1/chat/completions", "model": "m",
                          "requests": [{"custom_id": "a", "body": {"messages": [{"role": "user", "content": "hi"}]}}]}).encode())  # fmt: skip
    assert ok.status_code == 202 and ok.json()["status"] == "validating"


def test_a_cancelled_batch_returns_its_requests_as_cancelled_errors(serve, tmp_path, monkeypatch):
    # Nothing is answered before the cancel: serve runs the lines on an echo-batch backend
    # whose batch takes 100,000 polls (on plain echo they may be answered before the cancel
    # call lands, and a cancelled batch returns what it had done).
    url = serve("--backend", "echo-batch", "-o", f"dir={tmp_path / 'backend'}", "-o", "polls_to_complete=100000")
    route = create(_options(url))
    from lowtide.core.types import Request

    async def go():
        batch_id = await route.submit(
            "k",
            [
                Request(
                    f"c{i}",
                    "/v1/chat/completions",
                    {"model": "m", "messages": [{"role": "user", "content": "x"}]},
                )
                for i in range(3)
            ],
        )
        await route.cancel(batch_id)
        for _ in range(400):
            status = await route.poll(batch_id)
            if status.ended:
                break
            await asyncio.sleep(0.05)
        outcomes = [o async for o in route.results(batch_id)]
        await route.aclose()
        return status, outcomes

    status, outcomes = asyncio.run(go())
    assert status.phase == "cancelled"
    assert len(outcomes) == 3 and all(not o.ok and o.retryable for o in outcomes), outcomes


def test_lines_dropped_duplicated_and_cut_are_retried_and_the_batch_stays_readable(serve, tmp_path, monkeypatch):
    """serve's line faults on an OpenRouter batch: the dropped result and the cut one (kept as a
    JSON string inside the batch's JSON answer, which the route cannot read) are retried, the
    duplicated one applied once. Before, the cut entry broke GET /batches/{id} (HTTP 500) for
    every poll, and the batch's whole answers were never read (found by tests/sim)."""
    plan = tmp_path / "faults.yaml"
    plan.write_text(json.dumps({"batches": [{"first": 1, "drop_lines": 1, "duplicate_lines": 1, "corrupt_lines": 1}]}))
    url = serve("--api-key", KEY, "--faults", str(plan))
    monkeypatch.setenv(KEY_ENV, KEY)
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(6)), route=NAME, model="m", route_options=_options(url),
                     retry={"max_attempts": 3, "backoff_seconds": 0})  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets", timeout=60)  # a safety net: before, the polls failed until it ran out
    assert status.counts == {"succeeded": 6}
    with store.begin() as conn:
        first = conn.execute(sa.select(dispatches.c.provider_id).order_by(dispatches.c.id)).scalars().first()
        applied = conn.execute(sa.text("SELECT COUNT(*) FROM attempts WHERE applied AND ok")).scalar_one()
    assert applied == 6
    answer = httpx.get(f"{url}/api/v1/batches/{first}", headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [type(r).__name__ for r in results] == ["dict", "dict", "str", "dict", "dict", "dict"]  # 1 dropped, 1 twice, 1 cut


def test_sigkill_between_create_and_recording_the_id_adopts_the_batch(serve, tmp_path):
    url = serve()
    store_path = str(tmp_path / "client.db")
    spec = make_spec(
        write_csv(tmp_path / "t.csv", ticket_rows(6)), route=NAME, route_options=_options(url)
    )
    store = Store(store_path)
    load_job(store, spec, SystemClock())
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_CREATE, store_path],
        env=os.environ,
        capture_output=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    assert len(_all(_sdk(url))) == 1  # created, its id never recorded

    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 6}
    assert (
        len(_all(_sdk(url))) == 1
    )  # matched by size and window, proven by its custom_ids, adopted: not sent again
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar_one() == 1


def _body_spec(tmp_path, content, endpoint: str | None = None) -> JobSpec:
    """A job whose rows are request bodies: r1 plain, r2 with `content`."""
    path = tmp_path / f"rows-{len(list(tmp_path.iterdir()))}.jsonl"
    rows = [{"id": "r1", "body": {"messages": [{"role": "user", "content": "plain"}]}},
            {"id": "r2", "body": {"messages": [{"role": "user", "content": content}]}}]  # fmt: skip
    if endpoint:  # a completions body: a prompt
        rows = [{"id": "r1", "body": {"prompt": "x"}}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return JobSpec(name="rows", source={"path": str(path), "id_column": "id"}, template={"body_column": "body"}, model="m",
                   route=NAME, route_options={"api_key_env": KEY_ENV}, **({"endpoint": endpoint} if endpoint else {}))  # fmt: skip


@pytest.mark.parametrize(
    ("content", "endpoint", "words"),
    [
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}], None,
         ("row 2", "messages[0].content[0].image_url.url", "by public http(s) URL only", NAME)),
        ([{"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0xLjQK"}}], None,
         ("row 2", "messages[0].content[0].file.file_data", "host it and give its URL")),
        ("plain", "/v1/completions", ("endpoint", "OpenRouter's Batch API takes", "not /v1/completions")),
    ],
)  # fmt: skip
def test_inline_media_and_an_endpoint_not_batched_are_refused_at_load(
    content, endpoint, words, tmp_path, monkeypatch
):
    monkeypatch.setenv(KEY_ENV, KEY)
    spec = _body_spec(tmp_path, content, endpoint)
    store = Store(str(tmp_path / "client.db"))
    with pytest.raises((InputError, SpecError)) as refused:
        load_job(store, spec, SystemClock())
    said = str(refused.value)
    assert all(w in said for w in words), said
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar_one() == 0
    url_image = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    assert (
        load_job(
            Store(str(tmp_path / "ok.db")), _body_spec(tmp_path, url_image), SystemClock()
        ).rows
        == 2
    )  # an image by URL is taken


@pytest.mark.parametrize(
    ("options", "env", "words"),
    [
        ({}, {}, ("no API key", "OPENROUTER_API_KEY", "route_options.api_key_env")),
        ({"max_requests": 5_001}, {"OPENROUTER_API_KEY": KEY}, ("give at most 5,000",)),
        ({"callback_url": "https://x"}, {"OPENROUTER_API_KEY": KEY}, ("unknown route_options ['callback_url']",)),
        ({"allow_fallbacks": "no"}, {"OPENROUTER_API_KEY": KEY}, ("allow_fallbacks must be true or false",)),
    ],
)  # fmt: skip
def test_a_missing_key_or_a_bad_option_is_refused_before_anything_is_stored(
    options, env, words, tmp_path, monkeypatch
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = make_spec(
        write_csv(tmp_path / "t.csv", ticket_rows(3)), route=NAME, route_options=options
    )
    store = Store(str(tmp_path / "client.db"))
    with pytest.raises(SpecError) as refused:
        load_job(store, spec, SystemClock())
    said = str(refused.value)
    assert f"{NAME}: " in said and all(w in said for w in words), said
    assert KEY not in said
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0
    with pytest.raises(RouteError):
        create(options)


def test_the_key_is_never_stored_or_logged(serve, tmp_path, monkeypatch, caplog):
    """A create and polls answered 500 with the key in the message (a proxy that echoes its
    headers): the error is kept, the key scrubbed from it, from the store's bytes and the log."""
    echoed = f"bad header Authorization: Bearer {KEY}"
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"http": [{"match": "POST /api/v1/batches", "first": 1, "status": 500, "message": echoed},
                                             {"match": "GET /api/v1/batches/*", "first": 3, "status": 500, "message": echoed}]}))  # fmt: skip
    url = serve("--api-key", KEY, "--faults", str(plan))
    monkeypatch.setenv(KEY_ENV, KEY)
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(4)), route=NAME, model="meta-llama/llama-3.3-70b-instruct",
                     route_options=_options(url), retry={"max_attempts": 3, "backoff_seconds": 0})  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    caplog.set_level(logging.DEBUG)
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets", timeout=120)
    assert status.counts == {"succeeded": 4}
    with store.begin() as conn:
        stored = repr([tuple(r) for t in (jobs, requests, attempts, dispatches, events) for r in conn.execute(sa.select(t))])
        kinds = set(conn.scalars(sa.select(events.c.kind)))
    store.close()
    # The create is sent once (the SDK's retries off): its error is kept, scrubbed. The SDK
    # retries a poll's 500 itself, so those leave no event, only log lines (checked below).
    assert "submit_error" in kinds and "[api key]" in stored
    assert re.findall(r".{0,60}" + KEY[9:21] + ".{0,20}", stored) == []  # where it leaked, if it did
    assert KEY_ENV in stored  # the spec names the variable, never its value
    assert KEY not in caplog.text
    for path in tmp_path.glob("client.db*"):  # the database's own bytes, its WAL too
        assert KEY.encode() not in path.read_bytes(), path
