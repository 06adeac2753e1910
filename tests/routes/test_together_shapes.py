"""Together's batch answers (together-python types/batch.py): `lowtide serve` gives them for a
batch whose input was uploaded with Together's purpose `batch-api`, and
openai-compatible-batch reads them as it reads OpenAI's (routes/openai/compatible_batch.py).
A whole job through the together profile against serve is in test_compatible_batch.py."""

from __future__ import annotations

import json

import openai

from lowtide.core.cards import CARDS
from lowtide.routes.openai.compatible_batch import NAME, batch_status, job_of, seconds_of
from tests.conftest import wait_until

TOGETHER = CARDS[f"{NAME}:together"]
LINE = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}  # fmt: skip


def test_serve_answers_a_together_batch_in_togethers_shape(serve):
    client = openai.OpenAI(api_key="k", base_url=f"{serve()}/v1")
    uploaded = client.files.create(file=("b.jsonl", json.dumps(LINE).encode() + b"\n"), purpose="batch-api")  # type: ignore[arg-type]
    created = client.batches.with_raw_response.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    ).http_response.json()
    assert list(created) == ["job"]  # Together wraps the created batch
    job = created["job"]
    assert job["status"] in ("VALIDATING", "IN_PROGRESS") and "request_counts" not in job
    assert isinstance(job["created_at"], str) and seconds_of(job["created_at"]) > 0 and job["file_size_bytes"] == uploaded.bytes

    def ended() -> dict | None:
        batch = client.batches.with_raw_response.retrieve(job["id"]).http_response.json()
        return batch if batch["status"] == "COMPLETED" else None

    done = wait_until(ended, what="the Together batch to complete")
    assert done["progress"] == 100.0 and done["error"] is None and done["output_file_id"]
    status = batch_status(done, TOGETHER.ended_states(), TOGETHER.status)
    assert (status.phase, status.ended, status.counts) == ("COMPLETED", True, {"progress_percent": 100})
    # an OpenAI-purpose batch on the same serve keeps OpenAI's shape
    plain = client.files.create(file=("p.jsonl", json.dumps(LINE).encode() + b"\n"), purpose="batch")
    batch = client.batches.create(input_file_id=plain.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "validating" and batch.request_counts is not None


def test_a_failed_together_batch_says_why_from_its_error_text():
    failed = {"id": "b1", "status": "FAILED", "progress": 0.0, "error": "input file has 3 invalid lines"}
    status = batch_status(failed, TOGETHER.ended_states(), TOGETHER.status)
    assert (status.ended, status.errors, status.queue_full) == (True, ["input file has 3 invalid lines"], False)
    assert batch_status({"status": "CANCELING", "progress": 40}, TOGETHER.ended_states(), TOGETHER.status).ended is False
    assert job_of({"job": {"id": "b2"}}) == {"id": "b2"} and job_of({"id": "b3"}) == {"id": "b3"}
