"""mistral-batch: jobs through `lowtide serve` speaking Mistral's batch API (under `/mistral`,
server/mistral_api.py), the official mistralai SDK on both sides at its defaults; a refused
row fails alone; a job timed out part-way keeps what it answered and the rest goes to the
fallback; a crash between create and recording the id adopts the job; bad input is refused
before anything is stored; the key is never kept."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest
import sqlalchemy as sa
import yaml
from mistralai.client import Mistral
from mistralai.client.errors import SDKError

from lowtide.core.cards import CARDS
from lowtide.core.clock import SystemClock
from lowtide.core.errors import InputError
from lowtide.core.types import Request
from lowtide.engine.loader import load_job
from lowtide.routes.mistral.batch import NAME, create
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches, events, jobs, requests
from tests.conftest import make_spec, ticket_rows, whole_columns, write_csv
from tests.routes.conftest import KEY_ENV, _run
from tests.routes.test_batch_routes import KILL_AFTER_CREATE

KEY = "mst-" + "Qm7pR2sV9x" * 3  # long enough to be scrubbed (routes/base.py secret_of)
CHAT = "/v1/chat/completions"


@pytest.fixture(autouse=True)
def no_provider_env(monkeypatch):
    monkeypatch.delenv("MISTRAL_API_KEY", raising=False)


def _options(url: str, **more) -> dict:
    return {"base_url": f"{url}/mistral", "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2], **more}


def _mistral(url: str, key: str = KEY) -> Mistral:
    return Mistral(api_key=key, server_url=f"{url}/mistral")


def _load(tmp_path, url: str, n: int, **spec) -> Store:
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(n)), route=NAME, model="mistral-small-latest",
                     route_options=spec.pop("route_options", _options(url)), **spec)  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    return store


def test_a_job_runs_through_mistrals_job_api_and_a_refused_row_fails_alone(serve, tmp_path, monkeypatch):
    url = serve("--api-key", KEY, "--option", "reject=[T1003]")  # the echo backend refuses one row
    monkeypatch.setenv(KEY_ENV, KEY)
    store = _load(tmp_path, url, 12, route_options=_options(url, max_requests=5, timeout_hours=6))
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 11, "failed": 1}
    with store.begin() as conn:
        rows = {r.custom_id: r for r in conn.execute(sa.select(*whole_columns(requests)))}
        provider_ids = conn.execute(sa.select(dispatches.c.provider_id)).scalars().all()
    assert rows["T1004"].output == "Ticket: ticket 1004 about feedback"  # echo, matched by custom_id
    assert rows["T1003"].state == "failed" and "rejected by route_options.reject" in rows["T1003"].error_message
    # What Mistral would hold: 3 jobs (5 + 5 + 2), each of one model and endpoint, the key in its metadata.
    listed = _mistral(url).batch.jobs.list(page_size=100)
    assert listed.total == 3 and sorted(j.id for j in listed.data) == sorted(provider_ids)
    assert {(j.status, j.model, j.endpoint) for j in listed.data} == {("SUCCESS", "mistral-small-latest", CHAT)}
    assert all(j.metadata["lowtide_key"] for j in listed.data) and sum(j.total_requests for j in listed.data) == 12
    job = _mistral(url).batch.jobs.get(job_id=provider_ids[0])
    assert job.error_file or job.output_file and job.input_files  # the route's upload, as Mistral keeps it
    with pytest.raises(Exception, match="Status 401"):
        _mistral(url, "wrong-key").batch.jobs.list()


def test_a_job_timed_out_part_way_keeps_its_answers_and_the_rest_falls_back(serve, tmp_path, monkeypatch):
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"batches": [{"first": 1, "expire_after": 3}]}))  # 3 answered, then TIMEOUT_EXCEEDED
    url = serve("--faults", str(plan))
    store = _load(tmp_path, url, 8, fallback={"route": "echo"})
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 8}
    with store.begin() as conn:
        by_route = dict(conn.execute(sa.select(attempts.c.route, sa.func.count()).where(attempts.c.ok).group_by(attempts.c.route)).all())
        phase = conn.execute(sa.select(dispatches.c.phase).where(dispatches.c.route == NAME)).scalar_one()
    assert phase == "TIMEOUT_EXCEEDED" and by_route == {NAME: 3, "echo": 5}  # the answered 3 kept, not run again


def test_sigkill_between_create_and_recording_the_id_adopts_the_job(serve, tmp_path):
    url = serve()
    store_path = str(tmp_path / "client.db")
    _load(tmp_path, url, 6)
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_CREATE, store_path], env=os.environ, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    assert _mistral(url).batch.jobs.list().total == 1  # created, its id never recorded

    status = _run(Store(store_path), "tickets")
    assert status.counts == {"succeeded": 6}
    assert _mistral(url).batch.jobs.list().total == 1  # found by its metadata and adopted, not created again
    with Store(store_path).begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar_one() == 1


@pytest.mark.parametrize(
    ("options", "params", "words"),
    [
        ({}, {}, ("no API key", "MISTRAL_API_KEY", "route_options.api_key_env")),
        ({"api_key_env": KEY_ENV, "max_requests": 1_000_001}, {}, ("give at most 1,000,000",)),
        ({"api_key_env": KEY_ENV, "timeout_hours": 0}, {}, ("route_options.timeout_hours must be a whole number",)),
        ({"api_key_env": KEY_ENV}, {"seed": 7}, ("seed", "use `random_seed`", NAME)),
    ],
)
def test_bad_input_is_refused_before_anything_is_stored(options, params, words, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3)), route=NAME, model="mistral-small-latest",
                     route_options=options, params=params)  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    with pytest.raises(InputError) as refused:  # a spec's or its rows'
        load_job(store, spec, SystemClock())
    said = str(refused.value)
    assert all(w in said for w in words) and KEY not in said, said
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0
        assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar_one() == 0


def test_what_mistral_does_not_declare_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("MISTRAL_API_KEY", KEY)
    route = create({})
    assert str(route.client.sdk_configuration.get_server_details()[0]) == "https://api.mistral.ai"
    assert route.limits.max_requests == CARDS[NAME].limits.max_requests and route.limits.one_model_per_batch

    def refused(endpoint: str, body: dict):
        said = route.refusal(Request("a", endpoint, {"model": "m"} | body))
        return said and (said.field, said.reason)

    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert refused(CHAT, chat | {"random_seed": 1, "safe_prompt": True, "max_tokens": 9}) is None  # Mistral's own words pass
    assert refused(CHAT, chat | {"max_completion_tokens": 9})[0] == "max_completion_tokens"
    assert refused(CHAT, {"messages": [{"role": "developer", "content": "x"}]})[0] == "messages[0].role"
    assert refused(CHAT, {"messages": [{"role": "user", "name": "ann", "content": "x"}]})[0] == "messages[0].name"
    assert refused(CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "https://x/y.png"}]}]}) is None
    assert refused("/v1/embeddings", {"input": "x", "dimensions": 8})[1].endswith("use `output_dimension`")
    assert refused("/v1/responses", {"input": "x"})[0] == "endpoint"


def test_the_key_is_never_stored_or_logged(serve, tmp_path, monkeypatch, caplog):
    # a create answered 500 and polls answered 500 with the key in the message, as a proxy that echoes its headers might
    echoed = f"bad header authorization: Bearer {KEY}"
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"http": [{"match": "POST /v1/mistral/batch/jobs", "first": 1, "status": 500, "message": echoed},
                                             {"match": "GET /v1/mistral/batch/jobs/*", "first": 2, "status": 500, "message": echoed}]}))  # fmt: skip
    url = serve("--api-key", KEY, "--faults", str(plan))
    monkeypatch.setenv(KEY_ENV, KEY)
    caplog.set_level("DEBUG")
    store = _load(tmp_path, url, 4, retry={"max_attempts": 3, "backoff_seconds": 0})
    status = _run(store, "tickets", timeout=120)
    assert status.counts == {"succeeded": 4}
    with store.begin() as conn:
        stored = repr([tuple(r) for t in (jobs, requests, attempts, dispatches, events) for r in conn.execute(sa.select(t))])
        kinds = set(conn.scalars(sa.select(events.c.kind)))
    assert {"submit_error", "poll_error"} <= kinds and "[api key]" in stored  # the errors were kept, scrubbed
    assert KEY not in stored and KEY not in caplog.text
    for path in tmp_path.glob("client.db*"):  # the database's own bytes, its WAL too
        assert KEY.encode() not in path.read_bytes(), path


LINE = b'{"custom_id": "a", "body": {"messages": [{"role": "user", "content": "hi"}]}}\n'


def test_serve_speaks_mistrals_job_api_and_results_gone_past_retention_are_expired(serve, monkeypatch):
    """Serve's job API as the SDK reads it (files, the card's states, cancel, the metadata
    filter); and a job whose output file Mistral has deleted (past the card's results_s)
    yields no outcome and no error: its requests have no line, so the engine expires them."""
    url = serve()
    client = _mistral(url)
    up = client.files.upload(file={"file_name": "in.jsonl", "content": LINE}, purpose="batch")
    assert (up.purpose, up.sample_type, up.source) == ("batch", "batch_request", "upload")
    job = client.batch.jobs.create(input_files=[up.id], endpoint=CHAT, model="mistral-small-latest", metadata={"k": "v"}, timeout_hours=2)
    assert job.status in CARDS[NAME].status and job.metadata == {"k": "v"}
    try:
        client.batch.jobs.cancel(job_id=job.id)
        ended = ("CANCELLATION_REQUESTED", "CANCELLED", "SUCCESS")  # echo may finish the one line first
    except SDKError as err:  # echo finished it before the cancel arrived: refused, as Mistral does
        assert err.status_code == 400 and "Cannot cancel" in err.body, err
        ended = ("SUCCESS",)
    assert client.batch.jobs.get(job_id=job.id).status in ended
    assert client.batch.jobs.list(metadata={"k": "v"}).total == 1 and client.batch.jobs.list(metadata={"k": "w"}).total == 0

    monkeypatch.setenv(KEY_ENV, KEY)
    route = create(_options(url))

    async def gone() -> list:
        job = await route.client.batch.jobs.create_async(input_files=[up.id], endpoint=CHAT, model="m")
        while not (status := await route.poll(job.id)).ended:  # bounded by serve's fast clock, not timed
            await asyncio.sleep(0.05)
        assert status.phase == "SUCCESS" and [o.custom_id async for o in route.results(job.id)] == ["a"]
        output = (await route.client.batch.jobs.get_async(job_id=job.id)).output_file
        assert (await route.client.files.delete_async(file_id=output)).deleted
        return [o async for o in route.results(job.id)]

    assert asyncio.run(gone()) == []
