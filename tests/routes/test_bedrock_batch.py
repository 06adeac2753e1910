"""bedrock-batch: jobs through `lowtide serve` speaking Bedrock's batch inference control plane
(server/bedrock_api.py) with moto's S3 for input and output, boto3 at its defaults on both
sides: a round trip whose refused record fails alone (PartiallyCompleted); a create answered
500 after it ran, and a crash between create and recording the ARN, each leave one job (the
clientRequestToken, then `find`); a chunk under Bedrock's minimum is refused with its reason
and nothing sent; a missing role, region or credentials is refused before anything is
stored; credentials are never stored or logged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import boto3
import pytest
import sqlalchemy as sa
import yaml

from lowtide.core.clock import SystemClock
from lowtide.core.errors import InputError
from lowtide.core.types import Request
from lowtide.engine.loader import load_job
from lowtide.routes.bedrock import wire
from lowtide.routes.bedrock.batch import NAME
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches, events, jobs, requests
from tests.conftest import make_spec, ticket_rows, whole_columns, write_csv
from tests.objectstores import s3, s3_server  # noqa: F401  (fixtures; a test taking one says noqa: F811)
from tests.routes.conftest import _run
from tests.routes.test_batch_routes import KILL_AFTER_CREATE

ROLE = "arn:aws:iam::123456789012:role/BedrockBatch"
MODEL = "us.anthropic.claude-3-5-haiku-20241022-v1:0"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"  # a secret access key's shape: never stored nor logged


@pytest.fixture(autouse=True)
def aws_chain(monkeypatch):
    """AWS's chain from the environment only: no instance metadata lookups, no profile."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_PROFILE", "AWS_BEARER_TOKEN_BEDROCK", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)


def _options(url: str, bucket: str, **more) -> dict:
    return {"role_arn": ROLE, "staging": f"{bucket}/lowtide", "endpoint_url": url, "poll_interval": [0.05, 0.2], **more}


def _load(tmp_path, url: str, bucket: str, n: int, name: str = "tickets", **spec) -> Store:
    rows = write_csv(tmp_path / f"{name}.csv", ticket_rows(n))
    spec = make_spec(rows, name=name, route=NAME, model=MODEL, route_options=spec.pop("route_options", _options(url, bucket)), **spec)
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    return store


def _jobs(url: str) -> list[dict]:
    client = boto3.client("bedrock", endpoint_url=url, region_name="us-east-1")
    return client.list_model_invocation_jobs()["invocationJobSummaries"]


def test_a_job_runs_through_bedrock_and_a_refused_record_fails_alone(serve, s3, tmp_path, monkeypatch, caplog):  # noqa: F811
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # moto and serve take any; boto3 signs with it
    url = serve("--option", "reject=[T1003]")  # the echo backend refuses one record
    bucket = s3.bucket("lowtide-bedrock")
    caplog.set_level("DEBUG")
    store = _load(tmp_path, url, bucket, 100)
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 99, "failed": 1}
    with store.begin() as conn:
        rows = {r.custom_id: r for r in conn.execute(sa.select(*whole_columns(requests)))}
        key, arn, phase = conn.execute(sa.select(dispatches.c.key, dispatches.c.provider_id, dispatches.c.phase)).one()
    assert rows["T1004"].output == "Ticket: ticket 1004 about feedback"  # echo, matched by recordId
    assert rows["T1003"].state == "failed" and "rejected by route_options.reject" in rows["T1003"].error_message
    assert phase == "PartiallyCompleted"
    # What Bedrock holds: one job of the model, named and tokened by the dispatch's key, its input in S3 as Bedrock reads it.
    [job] = _jobs(url)
    assert (job["jobArn"], job["jobName"], job["clientRequestToken"], job["modelId"]) == (arn, key, key, MODEL)
    with s3.fs().open(f"lowtide-bedrock/lowtide/{key}/{key}.jsonl") as f:
        first = json.loads(f.readline())
    assert first["recordId"] == "T1000" and first["modelInput"]["anthropic_version"] == "bedrock-2023-05-31"
    assert "model" not in first["modelInput"] and first["modelInput"]["max_tokens"] == 256

    # A chunk under Bedrock's minimum of records: refused with its reason, nothing sent or staged.
    few = _load(tmp_path, url, bucket, 5, name="few")
    status = _run(few, "few")
    assert status.counts == {"failed": 5} and len(_jobs(url)) == 1
    with few.begin() as conn:
        few_id = conn.execute(sa.select(jobs.c.id).where(jobs.c.name == "few")).scalar_one()
        said = conn.execute(sa.select(requests.c.error_message).where(requests.c.job_id == few_id)).scalars().first()
    assert "at least 100 records" in said and MODEL in said and "route: anthropic" in said

    with store.begin() as conn:
        stored = repr([tuple(r) for t in (jobs, requests, attempts, dispatches, events) for r in conn.execute(sa.select(t))])
    assert SECRET not in stored and SECRET not in caplog.text  # (botocore logs the key id at DEBUG, never the secret)
    for path in tmp_path.glob("client.db*"):  # the database's own bytes, its WAL too
        assert SECRET.encode() not in path.read_bytes(), path


def test_a_create_answered_500_and_a_crash_after_create_leave_one_job(serve, s3, tmp_path):  # noqa: F811
    plan = tmp_path / "faults.yaml"  # the create runs, then answers 500: boto3 sends it again, with the same token
    plan.write_text(yaml.safe_dump({"http": [{"match": "POST /model-invocation-job", "first": 1, "status": 500, "after": True}]}))
    url = serve("--faults", str(plan))
    bucket = s3.bucket("lowtide-crash")
    store_path = str(tmp_path / "client.db")
    _load(tmp_path, url, bucket, 100)
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_CREATE, store_path], env=os.environ, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    assert len(_jobs(url)) == 1  # created once though asked twice; its ARN never recorded

    status = _run(Store(store_path), "tickets")
    assert status.counts == {"succeeded": 100}
    assert len(_jobs(url)) == 1  # found by its name and token, and adopted: not created again
    with Store(store_path).begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar_one() == 1


@pytest.mark.parametrize(
    ("options", "env", "words"),
    [
        ({"staging": "s3://b-ok/x"}, {}, ("no IAM role", "route_options.role_arn")),
        ({"role_arn": "BedrockBatch", "staging": "s3://b-ok/x"}, {}, ("not an IAM role ARN", "arn:aws:iam::ACCOUNT:role/NAME")),
        ({"role_arn": ROLE}, {}, ("no S3 place", "route_options.staging")),
        ({"role_arn": ROLE, "staging": "s3://b-ok/x"}, {"AWS_DEFAULT_REGION": None}, ("no AWS region", "AWS_REGION")),
        ({"role_arn": ROLE, "staging": "s3://b-ok/x"}, {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None},
         ("no AWS credentials", "AWS_ACCESS_KEY_ID", "never in the spec")),
        ({"role_arn": ROLE, "staging": "s3://b-ok/x", "timeout_hours": 200}, {}, ("24 to 168",)),
        ({"role_arn": ROLE, "staging": "s3://b-ok/x"}, {"model": "amazon.nova-lite-v1:0"}, ("not an Anthropic Claude model",)),
    ],
)
def test_a_missing_role_region_or_credentials_is_refused_before_anything_is_stored(options, env, words, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    model = env.pop("model", MODEL)
    for name, value in env.items():
        monkeypatch.delenv(name) if value is None else monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))  # no profile holds any either
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3)), route=NAME, model=model, route_options=options)
    store = Store(str(tmp_path / "client.db"))
    with pytest.raises(InputError) as refused:
        load_job(store, spec, SystemClock())
    said = str(refused.value)
    assert all(w in said for w in words) and SECRET not in said, said
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0
        assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar_one() == 0


def test_a_record_is_a_claude_messages_body_and_an_output_record_an_outcome():
    chat = Request("a1", "/v1/chat/completions", {"model": MODEL, "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]})
    assert wire.record(chat) == {"recordId": "a1", "modelInput": {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 9,
                                                                   "messages": [{"role": "user", "content": "hi"}]}}  # fmt: skip
    messages = Request("a2", "/v1/messages", {"model": MODEL, "max_tokens": 9, "messages": [], "service_tier": "auto"})
    assert wire.refusal(messages, NAME).field == "service_tier"
    assert wire.refusal(Request("a3", "/v1/embeddings", {"model": MODEL, "input": "x"}), NAME).field == "endpoint"

    message = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
               "usage": {"input_tokens": 5, "output_tokens": 1}}  # fmt: skip
    done = wire.outcome({"recordId": "a1", "modelInput": {}, "modelOutput": message})
    assert done.ok and done.text == "ok" and done.usage.input_tokens == 5 and done.response == message
    failed = wire.outcome({"recordId": "a2", "modelInput": {}, "error": {"errorCode": 429, "errorMessage": "slow down"}})
    assert not failed.ok and failed.retryable and failed.error_code == "http_429" and "slow down" in failed.error_message
    assert not wire.outcome({"recordId": "a3", "error": {"errorCode": 400, "errorMessage": "bad"}}).retryable


def test_a_remainder_under_the_minimum_borrows_from_the_chunk_before_it(serve, s3, tmp_path):  # noqa: F811
    # 260 requests in chunks of at most 200: not 200 + a 60 that Bedrock refuses, but 160 + 100.
    url = serve()
    bucket = s3.bucket("lowtide-remainder")
    store = _load(tmp_path, url, bucket, 260, chunk_size=200)
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 260}
    with store.begin() as conn:
        sizes = sorted(n for (n,) in conn.execute(sa.select(sa.func.count()).select_from(requests).group_by(requests.c.dispatch_id)))
    assert sizes == [100, 160] and len(_jobs(url)) == 2
