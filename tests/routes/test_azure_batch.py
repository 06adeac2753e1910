"""azure-batch: jobs through `lowtide serve` speaking Azure OpenAI's variant (its `/openai/v1`
paths, `api-version`, the key in `api-key`), the official openai SDK's AzureOpenAI on both
sides at its defaults; a crash between create and recording the id adopts the batch; a
missing endpoint or key is refused before anything is stored; the key is never kept."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys

import httpx
import openai
import pytest
import sqlalchemy as sa
import yaml

from lowtide.core.clock import SystemClock
from lowtide.core.errors import RouteError, SpecError
from lowtide.core.pricing import attempt_cost
from lowtide.core.types import Request, Usage
from lowtide.engine.loader import load_job
from lowtide.routes.azure.batch import NAME, create
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches, events, jobs, requests
from tests.conftest import make_spec, ticket_rows, whole_columns, write_csv
from tests.routes.conftest import KEY_ENV, _run
from tests.routes.test_batch_routes import KILL_AFTER_CREATE

KEY = "azk-" + "Qm7pR2sV9x" * 3  # long enough to be scrubbed (routes/base.py secret_of)


@pytest.fixture(autouse=True)
def no_provider_env(monkeypatch):
    monkeypatch.delenv("AZURE_OPENAI_ENDPOINT", raising=False)
    monkeypatch.delenv("AZURE_OPENAI_API_KEY", raising=False)


def _options(url: str, **more) -> dict:
    return {"endpoint": url, "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2], **more}


def _azure(url: str, key: str = KEY) -> openai.AzureOpenAI:
    """The SDK as Azure's v1 samples build it, but with the key in `api-key`."""
    return openai.AzureOpenAI(base_url=f"{url}/openai/v1/", api_key=key, api_version="v1")


def test_a_job_runs_through_azures_paths_and_a_refused_row_fails_alone(serve, tmp_path, monkeypatch):
    url = serve("--api-key", KEY, "--option", "reject=[T1003]")  # the echo backend refuses one row
    monkeypatch.setenv(KEY_ENV, KEY)
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(12)), route=NAME, model="gpt-4o-mini-batch",
                     route_options=_options(url, max_requests=5))  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 11, "failed": 1}
    with store.begin() as conn:
        rows = {r.custom_id: r for r in conn.execute(sa.select(*whole_columns(requests)))}
        provider_ids = conn.execute(sa.select(dispatches.c.provider_id)).scalars().all()
    assert rows["T1004"].output == "Ticket: ticket 1004 about feedback"  # echo, matched by custom_id
    assert rows["T1003"].state == "failed" and "rejected by route_options.reject" in rows["T1003"].error_message
    # What Azure would hold: 3 uploads with purpose batch (5 + 5 + 2), 24h windows, the key in metadata,
    # the deployment as each line's model; read back through both of the SDK's Azure forms.
    client = _azure(url)
    uploads = [f for f in client.files.list() if f.purpose == "batch"]
    batches = list(client.batches.list())
    assert len(uploads) == 3 and sorted(b.id for b in batches) == sorted(provider_ids)
    assert {b.completion_window for b in batches} == {"24h"} and all(b.metadata["lowtide_key"] for b in batches)
    assert b'"model":"gpt-4o-mini-batch"' in client.files.content(uploads[0].id).read().replace(b" ", b"")
    legacy = openai.AzureOpenAI(azure_endpoint=url, api_key=KEY, api_version="2024-10-21")  # /openai/batches?api-version=…
    assert sorted(b.id for b in legacy.batches.list()) == sorted(provider_ids)
    with pytest.raises(openai.AuthenticationError):
        _azure(url, "wrong-key").batches.list()
    # Azure's paths are renamed, not exempted: a web page of another site is still refused (server/guard.py)
    page = httpx.get(f"{url}/openai/v1/batches", headers={"api-key": KEY, "Origin": "https://elsewhere.example"})
    assert page.status_code == 403


def test_the_route_sends_the_key_in_azures_header_to_the_resources_v1_base(monkeypatch):
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", KEY)
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", "https://contoso.openai.azure.com/")
    route = create({})
    assert str(route.client.base_url) == "https://contoso.openai.azure.com/openai/v1/"
    assert route.client.auth_headers == {"api-key": KEY}  # not `Authorization: Bearer`: that is for Entra tokens
    assert route.client.default_query == {"api-version": "v1"}
    assert route.limits.max_requests == 100_000 and route.limits.max_bytes == 200 * 2**20
    assert (route.purpose, route.completion_window, route.send_metadata) == ("batch", "24h", True)
    # an endpoint given with Azure's path already means the same resource
    given = create({"endpoint": "https://contoso.openai.azure.com/openai/v1"})
    assert str(given.client.base_url) == "https://contoso.openai.azure.com/openai/v1/"
    assert create({"max_enqueued_tokens": {"gpt-4o-batch": 5_000_000}}).token_limit("gpt-4o-batch") == 5_000_000
    refused = route.refusal(Request("a", "/v1/moderations", {"model": "m", "input": "x"}))
    assert refused is not None and "Azure OpenAI Global Batch takes" in refused.reason


@pytest.mark.parametrize(
    ("options", "env", "words"),
    [
        ({}, {"AZURE_OPENAI_API_KEY": KEY}, ("no endpoint", "route_options.endpoint", "AZURE_OPENAI_ENDPOINT")),
        ({"endpoint": "https://contoso.openai.azure.com"}, {}, ("no API key", "AZURE_OPENAI_API_KEY", "route_options.api_key_env")),
        ({"endpoint": "http://contoso.openai.azure.com"}, {"AZURE_OPENAI_API_KEY": KEY}, ("plain http", "https://")),
        ({"endpoint": "https://c.openai.azure.com", "api_version": "2024-10-21"}, {"AZURE_OPENAI_API_KEY": KEY},
         ("speaks Azure's v1 API", "leave api_version out")),
        ({"endpoint": "https://c.openai.azure.com", "max_requests": 100_001}, {"AZURE_OPENAI_API_KEY": KEY}, ("give at most 100,000",)),
        ({"endpoint": "https://c.openai.azure.com", "tier": 3}, {"AZURE_OPENAI_API_KEY": KEY}, ("unknown route_options ['tier']",)),
    ],
)  # fmt: skip
def test_a_missing_endpoint_or_key_is_refused_before_anything_is_stored(options, env, words, tmp_path, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3)), route=NAME, route_options=options)
    store = Store(str(tmp_path / "client.db"))
    with pytest.raises(SpecError) as refused:
        load_job(store, spec, SystemClock())
    said = str(refused.value)
    assert f"{NAME}: " in said and all(w in said for w in words), said
    assert KEY not in said
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0
        assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar_one() == 0
    with pytest.raises(RouteError):
        create(options)


def test_sigkill_between_create_and_recording_the_id_adopts_the_batch(serve, tmp_path):
    url = serve()
    store_path = str(tmp_path / "client.db")
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(6)), route=NAME, route_options=_options(url))
    store = Store(store_path)
    load_job(store, spec, SystemClock())
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_CREATE, store_path], env=os.environ, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    assert len(list(_azure(url).batches.list())) == 1  # created, its id never recorded

    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 6}
    assert len(list(_azure(url).batches.list())) == 1  # found by its metadata and adopted, not created again
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar_one() == 1


def test_the_key_is_never_stored_or_logged(serve, tmp_path, monkeypatch, caplog):
    # Azure's paths reach serve's fault plan as OpenAI's: a create answered 500 and polls
    # answered 500 with the key in the message, as a proxy that echoes its headers might.
    echoed = f"bad header api-key: {KEY}"
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"http": [{"match": "POST /v1/batches", "first": 1, "status": 500, "message": echoed},
                                             {"match": "GET /v1/batches/*", "first": 3, "status": 500, "message": echoed}]}))  # fmt: skip
    url = serve("--api-key", KEY, "--faults", str(plan))
    monkeypatch.setenv(KEY_ENV, KEY)
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(4)), route=NAME, route_options=_options(url),
                     retry={"max_attempts": 3, "backoff_seconds": 0})  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    caplog.set_level(logging.DEBUG)
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets", timeout=120)
    assert status.counts == {"succeeded": 4}
    with store.begin() as conn:
        stored = repr([tuple(r) for t in (jobs, requests, attempts, dispatches, events) for r in conn.execute(sa.select(t))])
        kinds = set(conn.scalars(sa.select(events.c.kind)))
    assert {"submit_error", "poll_error"} <= kinds and "[api key]" in stored  # the errors were kept, scrubbed
    assert re.findall(r".{0,60}" + KEY[4:16] + ".{0,20}", stored) == []  # where it leaked, if it did
    assert KEY_ENV in stored  # the spec names the variable, never its value
    assert KEY not in caplog.text
    for path in tmp_path.glob("client.db*"):  # the database's own bytes, its WAL too
        assert KEY.encode() not in path.read_bytes(), path


def test_azure_bills_by_its_price_list_and_names_where_a_deployment_is_priced():
    # genai-prices keeps Azure's list: a deployment named as its model is priced at Azure's batch
    # price; one with a name of its own is not guessed at, and the note says where to price it.
    named = attempt_cost(Usage(input_tokens=1_000_000, output_tokens=1_000_000), "gpt-4o-mini", NAME)
    assert named.usd is not None and named.usd < named.realtime_usd, named
    own = attempt_cost(Usage(input_tokens=10, output_tokens=5), "gpt-4o-mini-batch", NAME)
    assert own.usd is None and "add it under `azure:` in a price file" in own.note, own.note
