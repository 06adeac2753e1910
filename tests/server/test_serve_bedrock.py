"""`lowtide serve` speaking AWS Bedrock's batch inference control plane (server/bedrock_api.py),
boto3's `bedrock` client at its defaults as the client, moto's S3 server for input and output
(pointed at by AWS_ENDPOINT_URL, as for any S3-compatible store): a job runs its records and
writes its .out records and manifest; a create sent again with its token answers the same
job; a record the backend refuses fails alone (PartiallyCompleted); too few records fail
the job as Bedrock's validation does; stop, list, get by ARN or id."""

from __future__ import annotations

import json
import time

import boto3
import pytest
from botocore.exceptions import ClientError

from lowtide.core.cards import CARDS
from tests.objectstores import s3, s3_server  # noqa: F401  (fixtures; a test taking one says noqa: F811)
from tests.routes.conftest import serve  # noqa: F401  (its fixture, not tests/server's)

ROLE = "arn:aws:iam::123456789012:role/BedrockBatch"
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
STATES = CARDS["bedrock-batch"].status


def _record(i: int, version: str = "bedrock-2023-05-31") -> dict:
    body = {"anthropic_version": version, "max_tokens": 32, "messages": [{"role": "user", "content": f"ticket {i}"}]}
    return {"recordId": f"R{i:04d}", "modelInput": body}


def _put(objects, bucket: str, key: str, lines: list[dict]) -> str:
    with objects.fs().open(f"{bucket.removeprefix('s3://')}/{key}", "wb") as f:
        f.write(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    return f"{bucket}/{key}"


def _client(url: str):
    return boto3.client("bedrock", endpoint_url=url, region_name="eu-west-1")


def _create(client, bucket: str, source: str, token: str = "tok1", name: str = "job1") -> str:
    return client.create_model_invocation_job(
        jobName=name, roleArn=ROLE, modelId=MODEL, clientRequestToken=token,
        inputDataConfig={"s3InputDataConfig": {"s3Uri": source}},
        outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"{bucket}/out/"}},
    )["jobArn"]  # fmt: skip


def _ended(client, arn: str) -> dict:
    for _ in range(600):  # bounded by serve's fast clock, not a timing
        job = client.get_model_invocation_job(jobIdentifier=arn)
        assert job["status"] in STATES, job["status"]
        if job["status"] in CARDS["bedrock-batch"].ended_states():
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {arn} did not end: {job['status']}")


def _out(objects, bucket: str, arn: str, name: str) -> list[dict]:
    path = f"{bucket.removeprefix('s3://')}/out/{arn.rsplit('/', 1)[-1]}/{name}"
    with objects.fs().open(path, "rb") as f:
        return [json.loads(line) for line in f.read().splitlines()] if name.endswith(".jsonl.out") else json.loads(f.read())


def test_a_job_runs_its_records_and_writes_them_back_and_bad_input_is_refused(serve, s3):  # noqa: F811
    url = serve("--option", "reject=[R0007]")  # the echo backend refuses one record: it fails alone
    bucket = s3.bucket("bedrock-io")
    source = _put(s3, bucket, "in/batch.jsonl", [_record(i) for i in range(100)])
    client = _client(url)
    arn = _create(client, bucket, source)
    assert arn.startswith("arn:aws:bedrock:eu-west-1:123456789012:model-invocation-job/")  # the region boto3 signed for
    assert _create(client, bucket, source) == arn  # the same token again: the same job, nothing new

    job = _ended(client, arn)
    assert job["status"] == "PartiallyCompleted" and job["clientRequestToken"] == "tok1" and job["modelId"] == MODEL
    assert (job["totalRecordCount"], job["successRecordCount"], job["errorRecordCount"]) == (100, 99, 1)
    assert job["submitTime"] <= job["endTime"] and job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"] == f"{bucket}/out/"
    lines = _out(s3, bucket, arn, "batch.jsonl.out")
    assert [line["recordId"] for line in lines] == [f"R{i:04d}" for i in range(100)]
    assert all(line["modelInput"] == _record(i)["modelInput"] for i, line in enumerate(lines))  # as it came
    failed = [line for line in lines if "error" in line]
    assert [line["recordId"] for line in failed] == ["R0007"] and failed[0]["error"]["errorCode"] == 400
    answer = lines[0]["modelOutput"]
    assert answer["type"] == "message" and answer["content"][0]["text"] and answer["usage"]["output_tokens"] >= 0
    manifest = _out(s3, bucket, arn, "manifest.json.out")
    assert manifest["totalRecordCount"] == 100 and manifest["successRecordCount"] == 99 and manifest["errorRecordCount"] == 1

    job_id = arn.rsplit("/", 1)[-1]
    assert client.get_model_invocation_job(jobIdentifier=job_id)["jobArn"] == arn  # by id as by ARN
    listed = client.list_model_invocation_jobs(nameContains="job1", sortOrder="Descending")["invocationJobSummaries"]
    assert [j["jobArn"] for j in listed] == [arn] and not client.list_model_invocation_jobs(nameContains="other")["invocationJobSummaries"]
    with pytest.raises(ClientError, match="ValidationException"):
        client.stop_model_invocation_job(jobIdentifier=arn)  # ended: nothing to stop
    with pytest.raises(ClientError, match="ResourceNotFoundException"):
        client.get_model_invocation_job(jobIdentifier="abcdefabcdef")

    # Too few records: Failed, as Bedrock's validation fails it; an unreadable input or a bad field: refused at create.
    few = _put(s3, bucket, "in/few.jsonl", [_record(i) for i in range(3)])
    job = _ended(client, _create(client, bucket, few, token="tok2", name="few"))
    assert job["status"] == "Failed" and "at least 100" in job["message"]
    with pytest.raises(ClientError, match="ValidationException.*Unable to read the input"):
        _create(client, bucket, f"{bucket}/in/missing.jsonl", token="tok3", name="missing")
    with pytest.raises(ClientError, match="ValidationException.*roleArn"):
        client.create_model_invocation_job(jobName="j", roleArn="not-a-role", modelId=MODEL,
                                           inputDataConfig={"s3InputDataConfig": {"s3Uri": few}},
                                           outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"{bucket}/out/"}})  # fmt: skip


def test_a_job_stopped_keeps_what_it_answered(serve, s3):  # noqa: F811
    url = serve("--time-scale", "1", "--complete-after", "3600")  # an hour, real time: still running when the stop arrives
    bucket = s3.bucket("bedrock-stop")
    client = _client(url)
    arn = _create(client, bucket, _put(s3, bucket, "in/b.jsonl", [_record(i) for i in range(100)]))
    client.stop_model_invocation_job(jobIdentifier=arn)
    job = _ended(client, arn)
    assert job["status"] == "Stopped"
    lines = _out(s3, bucket, arn, "b.jsonl.out")  # the records answered before the stop, the rest none
    assert len(lines) == job["successRecordCount"] + job["errorRecordCount"] <= 100
