"""The fault plan: every kind of fault, deterministic by count."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from lowtide.core.errors import SpecError
from lowtide.server.faults import FaultPlan, Faults, apply_line_faults
from tests.server.conftest import (
    chat_line,
    create_batch,
    file_lines,
    message_request,
    upload,
    wait_anthropic,
    wait_openai,
)


def test_http_429_for_the_first_n_calls_then_normal(serve, fault_plan):
    plan = fault_plan({"http": [{"match": "GET /v1/batches", "first": 2, "status": 429, "retry_after": 1}]})
    with serve(faults=plan) as s:
        client = s.openai()
        for _ in range(2):
            with pytest.raises(openai.RateLimitError) as err:
                client.batches.list()
            assert err.value.response.headers["retry-after"] == "1"
            assert err.value.body["code"] == "rate_limit_exceeded"
        assert client.batches.list().data == []
        assert upload(client, [{"x": 1}]).id  # other endpoints were never touched


def test_http_500_on_every_nth_call_with_wildcards_and_anthropic_shape(serve, fault_plan):
    plan = fault_plan({"http": [{"match": "GET /v1/messages/batches/*", "every": 2, "status": 500},
                                {"match": "* /v1/files/*", "calls": [1], "status": 503}]})  # fmt: skip
    with serve(faults=plan) as s:
        client = s.anthropic()
        batch = client.messages.batches.create(requests=[message_request("a")])
        outcomes = []
        for _ in range(4):
            try:
                client.messages.batches.retrieve(batch.id)
                outcomes.append("ok")
            except anthropic.InternalServerError as err:
                assert err.body["error"]["type"] == "api_error"
                outcomes.append(err.status_code)
        assert outcomes == ["ok", 500, "ok", 500]
        with pytest.raises(openai.InternalServerError):
            s.openai().files.retrieve("file-x")
        with pytest.raises(openai.NotFoundError):  # call 2 is not in `calls`
            s.openai().files.retrieve("file-x")


def test_a_slow_answer_times_the_client_out(serve, fault_plan):
    plan = fault_plan({"http": [{"match": "GET /v1/batches", "first": 1, "delay": 1}]})
    with serve(faults=plan) as s:
        with pytest.raises(openai.APITimeoutError):
            s.openai(timeout=0.2).batches.list()
        assert s.openai(timeout=5.0).batches.list().data == []


def test_a_batch_failed_at_validation(serve, fault_plan):
    plan = fault_plan({"batches": [{"api": "openai", "calls": [2], "fail_validation": {"code": "token_limit_exceeded", "message": "Enqueued token limit reached for gpt-test"}}]})
    with serve(faults=plan) as s:
        client = s.openai()
        first, second = (create_batch(client, [chat_line("a")]) for _ in range(2))
        assert wait_openai(client, first.id).status == "completed"
        failed = wait_openai(client, second.id)
        assert failed.status == "failed"
        assert [e.model_dump() for e in failed.errors.data] == [
            {"code": "token_limit_exceeded", "message": "Enqueued token limit reached for gpt-test", "param": None, "line": None}
        ]


def test_an_anthropic_batch_failed_at_validation_errors_every_request(serve, fault_plan):
    with serve(faults=fault_plan({"batches": [{"fail_validation": True}]})) as s:
        client = s.anthropic()
        batch = client.messages.batches.create(requests=[message_request("a"), message_request("b")])
        assert wait_anthropic(client, batch.id).request_counts.errored == 2
        assert {r.result.type for r in client.messages.batches.results(batch.id)} == {"errored"}


def test_expiry_part_way_keeps_what_ran(serve, fault_plan):
    with serve(faults=fault_plan({"batches": [{"expire_after": 3}]})) as s:
        client = s.openai()
        batch = wait_openai(client, create_batch(client, [chat_line(f"r{i}") for i in range(5)]).id)
        assert batch.status == "expired" and batch.expired_at is not None and batch.completed_at is None
        assert batch.request_counts.model_dump() == {"total": 5, "completed": 3, "failed": 2}
        assert sorted(x["custom_id"] for x in file_lines(client, batch.output_file_id)) == ["r0", "r1", "r2"]
        errors = file_lines(client, batch.error_file_id)
        assert sorted(e["custom_id"] for e in errors) == ["r3", "r4"]
        assert all(e["response"] is None and e["error"]["code"] == "batch_expired" for e in errors)

        messages = s.anthropic()
        mb = messages.messages.batches.create(requests=[message_request(f"m{i}") for i in range(5)])
        done = wait_anthropic(messages, mb.id)
        assert (done.request_counts.succeeded, done.request_counts.expired) == (3, 2)
        kinds = sorted(r.result.type for r in messages.messages.batches.results(mb.id))
        assert kinds == ["expired", "expired", "succeeded", "succeeded", "succeeded"]


def test_result_lines_dropped_duplicated_and_corrupted(serve, fault_plan):
    plan = fault_plan({"batches": [{"first": 1, "drop_lines": 1, "duplicate_lines": 1, "corrupt_lines": 1}]})
    with serve(faults=plan) as s:
        client = s.openai()
        batch = wait_openai(client, create_batch(client, [chat_line(f"r{i}") for i in range(5)]).id)
        assert batch.request_counts.completed == 5  # the counts tell the truth; the file does not
        raw = client.files.content(batch.output_file_id).text.splitlines()
        assert len(raw) == 5  # 5 - 1 dropped + 1 duplicate
        parsed, broken = [], 0
        for line in raw:
            try:
                parsed.append(json.loads(line)["custom_id"])
            except json.JSONDecodeError:
                broken += 1
        assert broken == 1
        assert len(parsed) == 4 and len(set(parsed)) == 3  # one id twice, one missing, one corrupt

        # The second batch is not hit (`first: 1`), and Anthropic's stream breaks on a bad line.
        clean = wait_openai(client, create_batch(client, [chat_line("a")]).id)
        assert [x["custom_id"] for x in file_lines(client, clean.output_file_id)] == ["a"]


def test_anthropic_results_with_a_corrupt_line_fail_to_parse(serve, fault_plan):
    with serve(faults=fault_plan({"batches": [{"api": "anthropic", "corrupt_lines": 1}]})) as s:
        client = s.anthropic()
        batch = client.messages.batches.create(requests=[message_request("a"), message_request("b")])
        wait_anthropic(client, batch.id)
        with pytest.raises(json.JSONDecodeError):
            list(client.messages.batches.results(batch.id))


def test_line_faults_apply_in_order():
    lines = [(f"line{i}", None) for i in range(6)]
    out = [line for line, _ in apply_line_faults(iter(lines), {"drop_lines": 1, "duplicate_lines": 2, "corrupt_lines": 1})]
    assert out == ["line1", "line1", "line2", "line2", "li", "line4", "line5"]


def test_selectors_and_rule_order():
    faults = Faults(FaultPlan.model_validate({"http": [
        {"match": "POST /v1/batches", "every": 2, "status": 500},
        {"match": "*", "first": 3, "status": 429},
    ]}))  # fmt: skip
    hits = [(r.status if (r := faults.for_call("POST", "/v1/batches")) else None) for _ in range(4)]
    assert hits == [429, 500, 429, 500]  # every rule counts its matches; the first that fires answers
    assert faults.for_call("GET", "/v1/files") is None  # the `*` rule's 5th match


def test_a_bad_fault_plan_names_the_file_and_key(tmp_path):
    path = tmp_path / "faults.yaml"
    path.write_text("http:\n  - match: '*'\n    first: 1\n    every: 2\n    status: 429\nbatches:\n  - drop_line: 1\n")
    with pytest.raises(SpecError) as err:
        FaultPlan.load(path)
    assert "http.0" in str(err.value) and "at most one of first, every, calls" in str(err.value)
    assert "batches.0.drop_line" in str(err.value)


def test_faults_come_after_the_key_check(serve, fault_plan):
    with serve(api_keys=("k",), faults=fault_plan({"http": [{"first": 1, "status": 500}]})) as s:
        with pytest.raises(openai.AuthenticationError):
            s.openai(key="wrong").batches.list()
        with pytest.raises(openai.InternalServerError):  # the first call with a good key
            s.openai(key="k").batches.list()
        assert s.openai(key="k").batches.list().data == []
