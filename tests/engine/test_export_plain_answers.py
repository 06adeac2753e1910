"""A plain answer's columns are exported from the finish_reason ingest stores beside it
(`requests.plain_answer`) instead of from its whole response: every file, in every format
and with `--full`, is byte for byte what the export writes from the responses alone (the
rows as stored before m017, whose `plain_answer` is NULL). Answers are generated: plain
ones with every kind of finish_reason, tool calls, refusals, reasoning, logprobs, n > 1,
failures with and without a body, odd shapes, and other endpoints' bodies."""

from __future__ import annotations

import random

import pytest
import sqlalchemy as sa

from lowtide.core.types import Outcome, Usage
from lowtide.engine.answer_columns import answer_values, plain_record, plain_values
from lowtide.engine.export import export_results
from lowtide.store.schema import requests
from tests.engine import answers as a
from tests.engine.ledger_helpers import dispatch, ingest

FINISHES = ["stop", "length", "content_filter", None, "", "stöp ✓", 'quote"d\\']


def raw_chat(message: dict, **choice) -> dict:
    """A chat body as a provider may send it, beyond what the SDK types build."""
    return {"object": "chat.completion", "model": "m", "choices": [{"index": 0, "message": message, **choice}]}


def generated_body(rng: random.Random, i: int) -> dict:
    kind = rng.randrange(14)
    text = rng.choice(["billing", "", "tech ✓", "x" * rng.randrange(1, 300)])
    finish = rng.choice(FINISHES)
    if kind < 4:  # the common plain answer
        return a.chat(a.choice(0, text, finish=rng.choice(["stop", "length", "content_filter"])))
    if kind == 4:  # plain, finish_reason missing, null or odd
        message = {"role": "assistant", "content": text}
        return raw_chat(message, **rng.choice([{}, {"finish_reason": finish}, {"finish_reason": 3}, {"finish_reason": ["stop"]}]))
    if kind == 5:
        return a.chat(a.choice(0, None, finish="tool_calls", calls=[(f"call_{i}", "get_weather", a.args(city="Paris", days=i))]))
    if kind == 6:
        return a.chat(a.choice(0, None, refusal=rng.choice(["I can't help with that.", ""])))
    if kind == 7:
        return a.chat(a.choice(0, text, logprobs=[("bill", -0.25, [("bill", -0.25)])]))
    if kind == 8:  # n > 1
        return a.chat(*(a.choice(n, f"{text}{n}", finish=rng.choice(["stop", "length"])) for n in range(rng.randrange(2, 4))))
    if kind == 9:  # reasoning, as vLLM / DeepSeek / OpenRouter send it
        key = rng.choice(["reasoning_content", "reasoning"])
        return raw_chat({"role": "assistant", "content": text, key: rng.choice(["thought", ""])}, finish_reason=finish)
    if kind == 10:  # empty or falsy extras: still plain
        extras = rng.choice([{"tool_calls": []}, {"tool_calls": None, "refusal": None}, {"refusal": ""}])
        return raw_chat({"role": "assistant", "content": text, **extras}, finish_reason=finish, logprobs=rng.choice([None, {}]))
    if kind == 11:  # not one chat choice
        return rng.choice([{"object": "chat.completion", "choices": []}, {"choices": [{"index": 0}]}, {"choices": "x"}, {"id": "?"}])
    if kind == 12:
        return a.message(a.text_block(text), stop=rng.choice(["end_turn", "max_tokens"]))
    return a.response(a.response_message(text))


def outcome_for(rng: random.Random, cid: str, i: int) -> Outcome:
    kind = rng.randrange(10)
    if kind == 0:  # a failure with the provider's error body
        return Outcome(cid, False, error_code="server_error", error_message="boom", response={"error": {"message": "boom"}})
    if kind == 1:  # a failure whose body is a plain chat answer (a provider that said 200 and then failed it)
        return Outcome(cid, False, error_code="invalid_request", error_message="bad", response=a.chat(a.choice(0, "no")))
    if kind == 2:  # no body at all
        return Outcome(cid, True, text="bare", usage=Usage(input_tokens=1, output_tokens=1))
    body = generated_body(rng, i)
    text = body.get("choices", [{}])[0].get("message", {}).get("content") if isinstance(body.get("choices"), list) and body["choices"] else None
    return Outcome(cid, True, text=text if isinstance(text, str) else "", usage=Usage(input_tokens=3, output_tokens=2), response=body)


@pytest.fixture
def generated_job(store, clock, tmp_path, monkeypatch):
    """400 generated answers, applied by the engine's own ingest; a few rows never loaded."""
    rng = random.Random(13)
    ids = [f"t{i:03}" for i in range(400)]
    params = {"max_tokens": 64, "tools": [a.weather_tool("/v1/chat/completions")]}
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ids, params=params)
    answered = ids[:390]  # the rest stay pending, with nothing stored
    dispatch_id = dispatch(store, job, job.spec.route, answered)
    ingest(store, job, dispatch_id, job.spec.route, [outcome_for(rng, cid, i) for i, cid in enumerate(answered)])
    return job


def exports(store, tmp_path, tag: str) -> dict[str, bytes]:
    out = {}
    for fmt in ("parquet", "csv", "jsonl"):
        for full in (False, True):
            path = tmp_path / f"{tag}-{full}.{fmt}"
            export_results(store, "tickets", path, full=full)
            out[f"{fmt} full={full}"] = path.read_bytes()
    return out


def test_exports_are_the_same_with_and_without_the_stored_plain_answers(store, tmp_path, generated_job):
    with store.begin() as conn:
        stored = conn.execute(sa.select(requests.c.plain_answer, requests.c.response)).all()
    plain = [p for p, _ in stored if p is not None]
    assert 100 < len(plain) < len(stored) - 100  # both paths are taken
    assert {plain_values(p)["finish_reason"] for p in plain} >= {"stop", "length", None, "", "stöp ✓"}
    with_records = exports(store, tmp_path, "with")
    with store.begin() as conn:  # the rows as stored before m017
        conn.execute(requests.update().values(plain_answer=None))
    assert exports(store, tmp_path, "without") == with_records


def test_a_request_started_again_keeps_no_answer_columns_from_its_old_response(store, tmp_path, generated_job):
    """A changed row that starts again has its response cleared (engine/changes.py): a
    plain_answer left beside no response is not read."""
    with store.begin() as conn:
        conn.execute(requests.update().where(requests.c.plain_answer.is_not(None)).values(response=None))
    with_records = exports(store, tmp_path, "with")
    with store.begin() as conn:
        conn.execute(requests.update().values(plain_answer=None))
    assert exports(store, tmp_path, "without") == with_records


@pytest.mark.parametrize("seed", range(3))
def test_the_plain_record_gives_what_the_response_gives(seed):
    rng = random.Random(seed)
    for i in range(500):
        body = generated_body(rng, i)
        record = plain_record(body)
        if record is not None:
            assert plain_values(record) == answer_values(body), body
    assert plain_record(None) is None
