"""`prune --keep-results` keeps every answer column, on both backends: the results of a job
(CSV, JSONL, Parquet, with and without `--full`, and a SQL table) are the same after it as
before, but for `--full`'s `response`, whatever the answers were: tool calls alone, refusals,
reasoning, logprobs, several choices, plain text, failures with a body, odd shapes, other
endpoints' bodies (engine/kept_answers.py).

Before, only a plain answer's columns survived (through `requests.plain_answer`); any other
answer's were read from the response the prune drops, so a tool-calling answer lost its calls
(and, without text, came out as `pruned`)."""

from __future__ import annotations

import csv
import json
import random

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from lowtide.core.types import Outcome, Usage
from lowtide.engine.answer_columns import (
    ANSWER_COLUMNS,
    answer_values,
    kept_record,
    plain_record,
    plain_values,
)
from lowtide.engine.archive import dropped_requests
from lowtide.engine.export import ResultRows, export_results
from lowtide.engine.retention import PRUNED, prune
from lowtide.engine.sql_sink import upsert_results
from lowtide.store.schema import dispatches, events, jobs, requests
from tests.engine import answers as a
from tests.engine.ledger_helpers import dispatch, ingest
from tests.engine.test_export_plain_answers import generated_body, outcome_for, raw_chat

DAY = 86400.0
LOGPROBS = [("bill", -0.25, [("bill", -0.25), ("tech", -1.5)]), ("ing", -0.01, [("ing", -0.01)])]
CALL = ("call_1", "get_weather", a.args(city="Paris", days=3))


def answer_kinds() -> dict[str, Outcome]:
    """One answer of each kind, as a route gives it (its text, and the body)."""
    bodies = {
        "plain": a.chat(a.choice(0, "billing")),
        "tools": a.chat(a.choice(0, None, finish="tool_calls", calls=[CALL])),
        "tools-and-text": a.chat(a.choice(0, "checking", finish="tool_calls", calls=[CALL, ("call_2", "get_weather", a.args(city="Oslo"))])),
        "refusal": a.chat(a.choice(0, None, refusal="I can't help with that.")),
        "reasoning": raw_chat({"role": "assistant", "content": "billing", "reasoning_content": "an invoice"}, finish_reason="stop"),
        "logprobs": a.chat(a.choice(0, "billing", logprobs=LOGPROBS)),
        "choices": a.chat(a.choice(0, "a"), a.choice(1, "b", finish="length", calls=[CALL]), a.choice(2, None, refusal="no")),
        "responses": a.response(a.response_reasoning("an invoice"), a.response_message("billing"), a.response_call("c1", "get_weather", CALL[2])),
        "messages": a.message(a.thinking_block("hmm"), a.text_block("billing"), a.tool_use("t1", "get_weather", {"city": "Oslo"})),
    }
    found = {cid: a.outcome(cid, body) for cid, body in bodies.items()}
    # A route that stores no text for an answer of tool calls alone: nothing but the calls is left.
    found["tools-no-text"] = Outcome("tools-no-text", True, text=None, usage=Usage(input_tokens=3, output_tokens=2), response=bodies["tools"])
    found["failed-chat"] = Outcome("failed-chat", False, error_code="invalid_request", error_message="bad", response=bodies["tools"])
    found["failed-plain"] = Outcome("failed-plain", False, error_code="invalid_request", error_message="bad", response=bodies["plain"])
    return found


@pytest.fixture
def answered_job(store, clock, tmp_path, monkeypatch):
    """A finished job of every kind of answer, and 150 generated ones (with failures, plain
    answers of every finish reason and bodies without one), applied by the engine's own
    ingest; two rows never answered (cancelled)."""
    kinds = answer_kinds()
    rng = random.Random(29)
    generated = {f"g{i:03}": outcome_for(rng, f"g{i:03}", i) for i in range(150)}
    outcomes = kinds | generated
    params = {"max_tokens": 64, "tools": [a.weather_tool("/v1/chat/completions")], "logprobs": True, "top_logprobs": 2}
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, [*outcomes, "never-1", "never-2"], params=params)
    dispatch_id = dispatch(store, job, job.spec.route, list(outcomes))
    ingest(store, job, dispatch_id, job.spec.route, list(outcomes.values()))
    with store.begin() as conn:  # the helper ingests without ending its batch or the job: end them, as a tick would
        conn.execute(sa.update(dispatches).where(dispatches.c.job_id == job.id).values(state="ended"))
        conn.execute(sa.update(requests).where(requests.c.job_id == job.id, requests.c.state == "pending").values(state="cancelled"))
        conn.execute(sa.update(jobs).where(jobs.c.id == job.id).values(state="finished", finished_at=clock.now()))
    clock.advance(2 * DAY)
    return job


def exports(store, tmp_path, tag: str) -> dict[str, list[dict]]:
    """Every format, with and without `full`, read back as rows."""
    out = {}
    for fmt in ("jsonl", "csv", "parquet"):
        for full in (False, True):
            path = export_results(store, "tickets", tmp_path / f"{tag}-{full}.{fmt}", full=full).path
            if fmt == "jsonl":
                rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
            elif fmt == "csv":
                with path.open(encoding="utf-8", newline="") as f:
                    rows = list(csv.DictReader(f))
            else:
                rows = pq.read_table(path).to_pylist()
            out[f"{fmt} full={full}"] = rows
    return out


def table_rows(url: str, table: str) -> list[dict]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            t = sa.Table(table, sa.MetaData(), autoload_with=conn)
            return [dict(r) for r in conn.execute(sa.select(t).order_by(t.c.custom_id)).mappings()]
    finally:
        engine.dispose()


def without_response(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "response"} for r in rows]


def test_results_are_the_same_after_a_keep_results_prune_but_for_the_full_response(store, clock, tmp_path, answered_job):
    sink = f"sqlite:///{tmp_path / 'sink.db'}"
    before = exports(store, tmp_path, "before")
    upsert_results(ResultRows(store, "tickets"), sink, "results")
    table_before = table_rows(sink, "results")
    rows = {r["custom_id"]: r for r in before["jsonl full=False"]}
    assert rows["tools"]["tool_calls"][0]["name"] == "get_weather" and rows["tools-no-text"]["tool_calls"] == rows["tools"]["tool_calls"]
    assert rows["refusal"]["refusal"] and rows["reasoning"]["reasoning"] and rows["logprobs"]["logprobs"] and len(rows["choices"]["choices"]) == 3
    assert rows["messages"]["tool_calls"] and rows["responses"]["reasoning"] and rows["failed-chat"]["tool_calls"]
    assert {r["state"] for r in rows.values()} == {"succeeded", "failed", "cancelled"}

    with store.read() as conn:
        changed = conn.execute(sa.select(sa.func.count()).select_from(requests).where(dropped_requests(answered_job.id, True, PRUNED))).scalar_one()

    done = prune(store, clock, DAY, keep_results=True)

    assert done.jobs == ["tickets"] and done.kept_results == ["tickets"] and done.requests == changed  # each row counted once
    with store.read() as conn:
        left = conn.execute(sa.select(sa.func.count()).select_from(requests).where(requests.c.response.is_not(None))).scalar_one()
    assert left == 0  # every raw response is gone
    after = exports(store, tmp_path, "after")
    for name, rows_before in before.items():
        rows_after = after[name]
        if "full=True" in name:
            assert all(r["response"] in (None, "") for r in rows_after), name
            rows_before, rows_after = without_response(rows_before), without_response(rows_after)
        assert rows_after == rows_before, name
    upsert_results(ResultRows(store, "tickets"), sink, "results")  # the table's own copy, written again
    upsert_results(ResultRows(store, "tickets"), sink, "fresh")
    assert table_rows(sink, "results") == table_before
    assert table_rows(sink, "fresh") == table_before
    assert 0 < done.kept < done.bytes  # the kept columns are answers, not what was dropped



def test_a_prune_that_drops_the_answers_after_it_marks_them_pruned_and_archives_the_kept_columns(store, clock, tmp_path, answered_job):
    """The record `--keep-results` kept is an answer: a later prune without it drops it with
    the text (the rows are `pruned`, no answer column left) and its archive holds it."""
    before = {r["custom_id"]: r for r in exports(store, tmp_path, "before")["jsonl full=False"]}
    prune(store, clock, DAY, keep_results=True)
    with store.read() as conn:
        said = conn.execute(sa.select(events.c.message).where(events.c.kind == "pruned")).scalars().all()
    assert len(said) == 1 and "characters of their answer columns kept in their place" in said[0]

    done = prune(store, clock, DAY, archive=tmp_path / "archive")

    after = {r["custom_id"]: r for r in exports(store, tmp_path, "after")["jsonl full=False"]}
    for cid, row in after.items():
        if before[cid]["state"] == "succeeded":
            assert row["state"] == "pruned" and row["output"] is None, cid
            assert all(row[c] is None for c in ANSWER_COLUMNS), cid
        else:
            assert row["state"] == before[cid]["state"], cid
    archived = {r["custom_id"]: r for r in pq.read_table(done.archives["tickets"]).to_pylist()}
    for cid in ("tools", "tools-no-text", "refusal", "choices", "messages", "failed-chat", "plain"):
        values = plain_values(archived[cid]["plain_answer"])
        assert {c: values[c] for c in ANSWER_COLUMNS} == {c: before[cid][c] for c in ANSWER_COLUMNS}, cid
    assert archived["plain"]["plain_answer"] == plain_record(a.chat(a.choice(0, "billing")))  # ingest's own record, as it was
    with store.read() as conn:
        assert set(conn.execute(sa.select(requests.c.payload).where(requests.c.state == "succeeded")).scalars()) == {PRUNED}


@pytest.mark.parametrize("seed", range(3))
def test_the_kept_record_gives_what_the_response_gives(seed):
    rng = random.Random(seed)
    for i in range(300):
        body = generated_body(rng, i)
        record = kept_record(body)
        assert record.startswith("{") and plain_values(record) == answer_values(body), body
    for outcome in answer_kinds().values():
        assert plain_values(kept_record(outcome.response)) == answer_values(outcome.response)
