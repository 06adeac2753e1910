"""`lowtide serve` speaks Vertex AI's batchPredictionJobs: google-genai with `vertexai=True`,
pointed at it, creates a job over a JSONL file in Cloud Storage (a GCS emulator), gets,
lists (by display name) and cancels it; the job's predictions.jsonl carries each request
back beside its response or its error; what serve cannot take is refused by name."""

from __future__ import annotations

import json

import pytest
from google import genai
from google.genai import errors, types
from google.oauth2.credentials import Credentials

from tests import objectstores
from tests.conftest import wait_until

MODEL = "gemini-2.5-flash"
ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_PARTIALLY_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED")
gcs, gcs_server = objectstores.gcs, objectstores.gcs_server  # the GCS emulator fixtures


def client(s) -> genai.Client:
    """The SDK as a Vertex user makes it, pointed at serve (v1, the version serve speaks)."""
    return genai.Client(vertexai=True, project="proj", location="us-central1", credentials=Credentials(token="t"),
                        http_options=types.HttpOptions(base_url=s.url, api_version="v1"))  # fmt: skip


def line(text: str, **request) -> dict:
    return {"request": {"contents": [{"role": "user", "parts": [{"text": text}]}], **request}}


def put(gcs, bucket: str, lines: list[dict]) -> str:
    uri = f"{bucket}/in/input.jsonl"
    gcs.fs().pipe(uri, "".join(json.dumps(x) + "\n" for x in lines).encode())
    return uri


def test_a_job_reads_its_input_from_gcs_and_writes_each_request_back_with_its_answer(server, gcs):
    bucket = gcs.bucket("serve-vertex")
    lines = [line(f"hello {i}", labels={"row": f"r{i}"}) for i in range(3)]
    lines.append(line("cached", cachedContent="cachedContents/c1", labels={"row": "r3"}))  # the echo backend refuses it
    c = client(server)
    made = c.batches.create(model=MODEL, src=put(gcs, bucket, lines), config={"dest": f"{bucket}/out", "display_name": "key-1"})
    assert made.name.startswith("projects/proj/locations/us-central1/batchPredictionJobs/") and made.display_name == "key-1"
    assert made.model == f"publishers/google/models/{MODEL}" and made.state.value in ("JOB_STATE_PENDING", "JOB_STATE_RUNNING")
    wait_until(lambda: c.batches.get(name=made.name).state.value in ENDED, what="the job to end")
    done = c.batches.get(name=made.name)
    assert done.state.value == "JOB_STATE_PARTIALLY_SUCCEEDED"  # one request failed
    assert (done.completion_stats.successful_count, done.completion_stats.failed_count) == (3, 1)
    folder = done.output_info.gcs_output_directory
    assert folder.startswith(f"{bucket}/out/prediction-model-")
    out = [json.loads(x) for x in gcs.fs().cat(f"{folder}/predictions.jsonl").decode().splitlines()]
    by_row = {x["request"]["labels"]["row"]: x for x in out}  # the request comes back as it went, labels too
    assert sorted(by_row) == ["r0", "r1", "r2", "r3"]
    assert by_row["r1"]["status"] == "" and by_row["r1"]["request"] == lines[1]["request"]
    assert by_row["r1"]["response"]["candidates"][0]["content"]["parts"][0]["text"] == "hello 1"
    refused = by_row["r3"]
    assert "response" not in refused and refused["status"].startswith("Bad Request: ")
    error = json.loads(refused["status"].split(": ", 1)[1])["error"]
    assert error["status"] == "INVALID_ARGUMENT" and "cachedContent" in error["message"]
    assert refused["request"] == lines[3]["request"]


def test_jobs_are_listed_by_display_name_and_cancelled_and_what_serve_cannot_take_is_refused(serve, gcs):
    with serve(complete_after=10**9) as s:  # the jobs run until cancelled
        _list_cancel_refuse(s, gcs)


def _list_cancel_refuse(server, gcs):
    bucket = gcs.bucket("serve-vertex-list")
    c = client(server)
    src = put(gcs, bucket, [line("hi")])
    names = [c.batches.create(model=MODEL, src=src, config={"dest": f"{bucket}/out", "display_name": f"key-{i}"}).name for i in range(3)]
    found = list(c.batches.list(config={"filter": 'display_name="key-1"'}))
    assert [j.name for j in found] == [names[1]]
    assert {j.name for j in c.batches.list(config={"page_size": 2})} == set(names)  # page by page, newest first
    with pytest.raises(errors.ClientError, match="one filter served"):
        list(c.batches.list(config={"filter": 'state="JOB_STATE_RUNNING"'}))
    c.batches.cancel(name=names[0])
    wait_until(lambda: c.batches.get(name=names[0]).state.value in ENDED, what="the job to end")
    assert c.batches.get(name=names[0]).state.value == "JOB_STATE_CANCELLED"
    with pytest.raises(errors.ClientError, match="already ended"):
        c.batches.cancel(name=names[0])
    with pytest.raises(errors.ClientError, match="404"):
        c.batches.get(name="projects/proj/locations/us-central1/batchPredictionJobs/123")
    with pytest.raises(errors.ClientError, match="not served here"):
        c.batches.create(model="publishers/meta/models/llama-4", src=src, config={"dest": f"{bucket}/out"})
    with pytest.raises(errors.ClientError, match="missing.jsonl: not found"):
        c.batches.create(model=MODEL, src=f"{bucket}/in/missing.jsonl", config={"dest": f"{bucket}/out"})
