"""vertex-batch: jobs through `lowtide serve` speaking Vertex AI's batchPredictionJobs
(server/vertex_api.py), google-genai with `vertexai=True` on both sides, inputs and
predictions in a GCS emulator: a round trip with a refused row failing alone; a job ended
part-way keeps what it answered and the rest falls back; a crash between create and
recording the id adopts the job by its display name; bad input and missing credentials or
project are refused before anything is stored; the access token is never kept."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys

import pytest
import sqlalchemy as sa
import yaml
from google import genai
from google.genai import types
from google.oauth2.credentials import Credentials

from lowtide.core.clock import SystemClock
from lowtide.core.endpoints import GEMINI
from lowtide.core.errors import InputError, RouteUnavailableError
from lowtide.core.spec import JobSpec
from lowtide.core.types import Request
from lowtide.engine.loader import load_job
from lowtide.routes import create_route
from lowtide.routes.vertex import lines
from lowtide.routes.vertex.batch import NAME, create
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches, events, jobs, requests
from tests import objectstores
from tests.conftest import make_spec, ticket_rows, whole_columns, write_csv
from tests.routes.conftest import _run
from tests.routes.test_batch_routes import KILL_AFTER_CREATE

TOKEN = "ya29." + "Vx7qK2mP9t" * 3  # an access token, long enough to be scrubbed
TOKEN_ENV = "LOWTIDE_TEST_VERTEX_TOKEN"
MODEL = "gemini-2.5-flash"
gcs, gcs_server = objectstores.gcs, objectstores.gcs_server  # the GCS emulator fixtures


@pytest.fixture(autouse=True)
def google_env(monkeypatch):
    """No project, location or credentials of the machine's: each test gives its own. The
    serve subprocess reaches the emulator the way gcsfs documents (FSSPEC_GCS_TOKEN=anon)."""
    for name in ("GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # no metadata server to wait for
    monkeypatch.setenv("FSSPEC_GCS_TOKEN", "anon")
    monkeypatch.setenv("FSSPEC_GCS_PROJECT", "test")


def _options(url: str, bucket: str, **more) -> dict:
    return {"base_url": url, "project": "proj", "location": "us-central1", "staging": f"{bucket}/lowtide",
            "access_token_env": TOKEN_ENV, "poll_interval": [0.05, 0.2], **more}  # fmt: skip


def _client(url: str) -> genai.Client:
    return genai.Client(vertexai=True, project="proj", location="us-central1", credentials=Credentials(token=TOKEN),
                        http_options=types.HttpOptions(base_url=url, api_version="v1"))  # fmt: skip


def _load(tmp_path, options: dict, n: int, **spec) -> Store:
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(n)), route=NAME, model=MODEL, route_options=options, **spec)
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    return store


def _gemini_rows(tmp_path, n: int, refused: str | None = None) -> JobSpec:
    """A job of Gemini bodies (`template.body_column`); the `refused` row asks for a cached
    content, which Vertex takes and serve's echo backend does not."""
    path = tmp_path / "rows.jsonl"
    with path.open("w") as f:
        for i in range(n):
            cid = f"T{1000 + i}"
            body = {"contents": [{"role": "user", "parts": [{"text": f"ticket {1000 + i}"}]}]}
            f.write(json.dumps({"id": cid, "body": body | ({"cachedContent": "cachedContents/c1"} if cid == refused else {})}) + "\n")
    return path


def test_a_job_runs_through_vertex_and_a_refused_row_fails_alone(serve, gcs, tmp_path, monkeypatch):
    url = serve("--api-key", TOKEN)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    bucket = gcs.bucket("vertex-trip")
    spec = JobSpec(name="tickets", source={"path": str(_gemini_rows(tmp_path, 12, refused="T1003")), "id_column": "id"},
                   template={"body_column": "body"}, endpoint=GEMINI, model=MODEL, route=NAME,
                   route_options=_options(url, bucket, max_requests=5))  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 11, "failed": 1}
    with store.begin() as conn:
        rows = {r.custom_id: r for r in conn.execute(sa.select(*whole_columns(requests)))}
        provider_ids = conn.execute(sa.select(dispatches.c.provider_id)).scalars().all()
        phases = set(conn.execute(sa.select(dispatches.c.phase)).scalars())
    assert "ticket 1004" in rows["T1004"].output  # echo, matched by the label
    assert rows["T1003"].state == "failed" and "cachedContent" in rows["T1003"].error_message
    assert rows["T1003"].error_code == "invalid_argument"  # Vertex's status line, read: not retried
    assert phases == {"JOB_STATE_SUCCEEDED", "JOB_STATE_PARTIALLY_SUCCEEDED"}  # the one with T1003 partly
    # What Vertex would hold: 3 jobs (5 + 5 + 2), named by their dispatch keys, inputs and outputs in the bucket.
    client = _client(url)  # held: a client let go closes its connections
    listed = list(client.batches.list(config={"page_size": 100}))
    assert sorted(j.name for j in listed) == sorted(provider_ids) and len(listed) == 3
    assert all(j.display_name and j.model == f"publishers/google/models/{MODEL}" for j in listed)
    job = listed[0]
    assert job.src.gcs_uri == [f"{bucket}/lowtide/{job.display_name}/input.jsonl"]
    assert job.output_info.gcs_output_directory.startswith(f"{bucket}/lowtide/{job.display_name}/output/")
    fs = gcs.fs()
    first = json.loads(fs.cat(job.src.gcs_uri[0]).decode().splitlines()[0])
    assert set(first) == {"request"} and "model" not in first["request"]
    assert lines.custom_id_of(first["request"]["labels"]).startswith("T10")
    stranger = genai.Client(vertexai=True, project="proj", location="us-central1", credentials=Credentials(token="wrong"),
                            http_options=types.HttpOptions(base_url=url, api_version="v1"))  # fmt: skip
    with pytest.raises(genai.errors.ClientError, match="invalid authentication credentials") as refused:  # as Vertex does
        stranger.batches.list()
    assert refused.value.code == 401 and refused.value.status == "UNAUTHENTICATED"  # a refused key: the engine holds, not retries


def test_a_job_expired_part_way_keeps_its_answers_and_the_rest_falls_back(serve, gcs, tmp_path, monkeypatch):
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"batches": [{"first": 1, "expire_after": 3}]}))  # 3 answered, then EXPIRED
    url = serve("--faults", str(plan))
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    store = _load(tmp_path, _options(url, gcs.bucket("vertex-part")), 8, fallback={"route": "echo"})
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 8}
    with store.begin() as conn:
        by_route = dict(conn.execute(sa.select(attempts.c.route, sa.func.count()).where(attempts.c.ok).group_by(attempts.c.route)).all())
        phase = conn.execute(sa.select(dispatches.c.phase).where(dispatches.c.route == NAME)).scalar_one()
    assert phase == "JOB_STATE_EXPIRED" and by_route == {NAME: 3, "echo": 5}  # the answered 3 kept, not run again


def test_sigkill_between_create_and_recording_the_id_adopts_the_job_by_display_name(serve, gcs, tmp_path, monkeypatch):
    url = serve()
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    store_path = str(tmp_path / "client.db")
    _load(tmp_path, _options(url, gcs.bucket("vertex-kill")), 6)
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_CREATE, store_path], env=os.environ, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    client = _client(url)  # held: a client let go closes its connections
    assert len(list(client.batches.list())) == 1  # created, its id never recorded

    status = _run(Store(store_path), "tickets")
    assert status.counts == {"succeeded": 6}
    assert len(list(client.batches.list())) == 1  # found by its display name and adopted, not created again
    with Store(store_path).begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar_one() == 1


@pytest.mark.parametrize(
    ("options", "env", "model", "words"),
    [
        ({"project": "p", "staging": "gs://b/x"}, {}, MODEL, ("no Google Cloud credentials", "gcloud auth application-default login")),
        ({"staging": "gs://b/x", "access_token_env": TOKEN_ENV}, {TOKEN_ENV: TOKEN}, MODEL, ("no Google Cloud project", "GOOGLE_CLOUD_PROJECT")),
        ({"project": "p", "staging": "gs://b/x", "access_token_env": "MISSING_TOKEN_VAR"}, {}, MODEL, ("MISSING_TOKEN_VAR", "not set")),
        ({"project": "p", "staging": "s3://b/x", "access_token_env": TOKEN_ENV}, {TOKEN_ENV: TOKEN}, MODEL, ("route_options.staging must be a gs:// prefix",)),
        ({"project": "p", "staging": "gs://b/x", "anonymous": True}, {}, MODEL, ("route_options.anonymous is only for a server on this machine",)),
        ({"project": "p", "staging": "gs://b/x", "access_token_env": TOKEN_ENV, "max_requests": 200_001}, {TOKEN_ENV: TOKEN}, MODEL,
         ("give at most 200,000",)),
        ({"project": "p", "staging": "gs://b/x", "access_token_env": TOKEN_ENV}, {TOKEN_ENV: TOKEN}, "gemini-9-nonesuch",
         ('unknown Gemini model "gemini-9-nonesuch"', "route_options.models")),
        ({"project": "p", "staging": "gs://b/x", "access_token_env": TOKEN_ENV}, {TOKEN_ENV: TOKEN}, "publishers/meta/models/llama-4",
         ("not one of Google's Gemini models",)),
    ],
)
def test_bad_input_is_refused_before_anything_is_stored(options, env, model, words, tmp_path, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))  # ADC finds nothing
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3)), route=NAME, model=model, route_options=options)
    store = Store(str(tmp_path / "client.db"))
    with pytest.raises(InputError) as refused:
        load_job(store, spec, SystemClock())
    said = str(refused.value)
    assert all(w in said for w in words) and TOKEN not in said, said
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0
        assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar_one() == 0


def test_the_access_token_is_never_stored_or_logged(serve, gcs, tmp_path, monkeypatch, caplog):
    """A create and polls answered 500 with the token in the message (a proxy that echoes
    its headers): the error is kept, the token scrubbed from it, from the store's bytes and the log."""
    echoed = f"bad header Authorization: Bearer {TOKEN}"
    jobs_path = "/v1beta/projects/proj/locations/us-central1/batchPredictionJobs"  # Vertex's /v1, as serve sees it
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"http": [{"match": f"POST {jobs_path}", "first": 1, "status": 500, "message": echoed},
                                             {"match": f"GET {jobs_path}/*", "first": 2, "status": 500, "message": echoed}]}))  # fmt: skip
    url = serve("--api-key", TOKEN, "--faults", str(plan))
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    caplog.set_level(logging.DEBUG)
    store = _load(tmp_path, _options(url, gcs.bucket("vertex-secret")), 4, retry={"max_attempts": 3, "backoff_seconds": 0})
    status = _run(store, "tickets", timeout=120)
    assert status.counts == {"succeeded": 4}
    with store.begin() as conn:
        stored = repr([tuple(r) for t in (jobs, requests, attempts, dispatches, events) for r in conn.execute(sa.select(t))])
        kinds = set(conn.scalars(sa.select(events.c.kind)))
    store.close()
    assert "submit_error" in kinds and "[api key]" in stored
    assert re.findall(r".{0,60}" + TOKEN[5:17] + ".{0,20}", stored) == []  # where it leaked, if it did
    assert TOKEN_ENV in stored  # the spec names the variable, never its value
    assert TOKEN not in caplog.text
    for path in tmp_path.glob("client.db*"):  # the database's own bytes, its WAL too
        assert TOKEN.encode() not in path.read_bytes(), path


def test_what_vertex_does_not_take_is_refused_by_name_and_ids_round_trip():
    assert lines.custom_id_of(lines.id_labels("Ticket 48213/ü")) == "Ticket 48213/ü"
    long = "x" * 200
    labels = lines.id_labels(long)
    assert len(labels) > 1 and all(len(v) <= 63 and v == v.lower() for v in labels.values())
    assert lines.custom_id_of(labels) == long and lines.custom_id_of({"other": "x"}) is None

    def refused(body: dict):
        said = lines.refusal(Request("a", "/v1beta/models:generateContent", {"model": MODEL} | body), NAME)
        return said and said.field

    contents = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    assert refused(contents | {"labels": {"team": "ops"}}) is None
    assert refused(contents | {"serviceTier": "flex"}) == "serviceTier"
    assert refused(contents | {"labels": {"lowtide_id": "x"}}) == "labels.lowtide_id"
    assert refused(contents | {"labels": {f"k{i}": "v" for i in range(64)}}) == "labels"
    line = lines.request_line(Request("T1", "/v1beta/models:generateContent", {"model": MODEL} | contents | {"labels": {"team": "ops"}}), NAME)
    assert "model" not in line["request"] and line["request"]["labels"]["team"] == "ops"
    failed = lines.parse_output_line({"status": 'Bad Request: {"error": {"code": 400, "message": "no", "status": "INVALID_ARGUMENT"}}',
                                      "request": line["request"]})  # fmt: skip
    assert (failed.custom_id, failed.ok, failed.error_code, failed.retryable) == ("T1", False, "invalid_argument", False)
    busy = lines.parse_output_line({"status": "Internal error: UNAVAILABLE", "request": line["request"]})
    assert busy.retryable and busy.error_code == "unavailable"


def test_a_failed_job_fails_its_batch_with_vertexs_error(serve, gcs, tmp_path, monkeypatch):
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"batches": [{"api": "gemini", "fail_validation": {"code": "invalid", "message": "quota gone"}}]}))
    url = serve("--faults", str(plan))
    options = {k: v for k, v in _options(url, gcs.bucket("vertex-failed")).items() if k != "access_token_env"}
    route = create(options | {"anonymous": True})  # no key at serve: no token needed

    async def go():
        try:
            name = await route.submit("job-1.d1", [Request.chat(f"r{i}", MODEL, [{"role": "user", "content": "hi"}]) for i in range(3)])
            for _ in range(200):  # the server's fast clock ends it within a few polls
                status = await route.poll(name)
                if status.ended:
                    return status
                await asyncio.sleep(0.02)
            raise AssertionError("the job did not end")
        finally:
            await route.aclose()

    status = asyncio.run(go())
    assert status.phase == "JOB_STATE_FAILED" and status.errors == ["3: quota gone"]


def test_without_gcsfs_the_route_is_refused_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if not installed
    with pytest.raises(RouteUnavailableError, match=r"pip install 'lowtide\[vertex\]'"):
        create_route(NAME, {})
