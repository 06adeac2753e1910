"""The export keeps what the provider returned: text, tool calls, refusal, finish reason,
logprobs, every choice, reasoning and parsed fields, as nested values (Parquet structs and
lists, JSONL objects with integers kept) or JSON text (CSV), from the stored answer of each
endpoint; `--full` adds the whole body. Answers are SDK-built bodies applied by the
engine's own ingest (tests/engine/answers.py)."""

from __future__ import annotations

import csv
import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lowtide.engine import export
from lowtide.engine.answer_columns import answer_values
from lowtide.engine.export import ResultRows, export_results
from tests.engine import answers as a

LOGPROBS = [("bill", -0.25, [("bill", -0.25), ("tech", -1.5)]), ("ing", -0.01, [("ing", -0.01)])]


def chat_answers() -> dict[str, dict]:
    return {
        "text": a.chat(a.choice(0, "billing", logprobs=LOGPROBS)),
        "tool": a.chat(a.choice(0, None, finish="tool_calls", calls=[("call_1", "get_weather", a.args(city="Paris", days=3))])),
        "refused": a.chat(a.choice(0, None, refusal="I can't help with that.")),
        "many": a.chat(a.choice(0, "a"), a.choice(1, "b", finish="length"), a.choice(2, "c")),
    }


@pytest.fixture
def chat_job(store, clock, tmp_path, monkeypatch):
    params = {"max_tokens": 64, "tools": [a.weather_tool("/v1/chat/completions")], "logprobs": True, "top_logprobs": 2}
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, list(chat_answers()), params=params)
    a.answer_all(store, job, chat_answers())
    assert {c: r.state for c, r in a.states(store).items()} == dict.fromkeys(chat_answers(), "succeeded")
    return job


def jsonl_rows(path) -> dict[str, dict]:
    return {r["ticket_id"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())}


def expected_chat_columns() -> dict[str, dict]:
    """What each chat row's answer columns must hold, from the bodies themselves."""
    lp = [
        {"token": t, "logprob": v, "bytes": list(t.encode()), "top_logprobs": [{"token": a, "logprob": b, "bytes": list(a.encode())} for a, b in top]}
        for t, v, top in LOGPROBS
    ]  # fmt: skip
    none = {"tool_calls": None, "refusal": None, "reasoning": None, "logprobs": None, "choices": None}
    many = [
        {"index": i, "text": t, "tool_calls": None, "refusal": None, "finish_reason": f, "logprobs": None, "reasoning": None}
        for i, (t, f) in enumerate([("a", "stop"), ("b", "length"), ("c", "stop")])
    ]  # fmt: skip
    call = {"id": "call_1", "type": "function", "name": "get_weather", "arguments": a.args(city="Paris", days=3)}
    return {
        "text": none | {"output": "billing", "finish_reason": "stop", "logprobs": lp},
        "tool": none | {"output": "", "finish_reason": "tool_calls", "tool_calls": [call]},
        "refused": none | {"output": "", "finish_reason": "stop", "refusal": "I can't help with that."},
        "many": none | {"output": "a", "finish_reason": "stop", "choices": many},
    }


def test_jsonl_has_every_answer_field_as_objects_and_integers_stay_integers(store, tmp_path, chat_job):
    export_results(store, "tickets", tmp_path / "out.jsonl")
    out = jsonl_rows(tmp_path / "out.jsonl")
    for cid, want in expected_chat_columns().items():
        assert {k: out[cid][k] for k in want} == want, cid
    assert type(out["text"]["input_tokens"]) is int and out["text"]["input_tokens"] == 12
    assert type(out["text"]["output_tokens"]) is int and type(out["text"]["attempts"]) is int
    assert type(out["text"]["logprobs"][0]["bytes"][0]) is int
    assert "response" not in out["text"]  # only with full


def test_parquet_has_every_answer_field_as_structs_and_lists(store, tmp_path, chat_job):
    export_results(store, "tickets", tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    schema = table.schema
    call = schema.field("tool_calls").type
    assert pa.types.is_list(call) and pa.types.is_struct(call.value_type)
    assert [call.value_type.field(i).name for i in range(4)] == ["id", "type", "name", "arguments"]
    lp = schema.field("logprobs").type.value_type
    assert lp.field("logprob").type == pa.float64() and lp.field("bytes").type == pa.list_(pa.int64())
    assert pa.types.is_list(schema.field("choices").type)
    assert schema.field("input_tokens").type == pa.int64()
    rows = {r["ticket_id"]: r for r in table.to_pylist()}
    for cid, want in expected_chat_columns().items():
        assert {k: rows[cid][k] for k in want} == want, cid


def test_csv_has_one_column_per_field_with_nested_values_as_json_text(store, tmp_path, chat_job):
    export_results(store, "tickets", tmp_path / "out.csv")
    with (tmp_path / "out.csv").open(encoding="utf-8") as f:
        rows = {r["ticket_id"]: r for r in csv.DictReader(f)}
    want = expected_chat_columns()
    assert json.loads(rows["tool"]["tool_calls"]) == want["tool"]["tool_calls"]
    assert json.loads(rows["text"]["logprobs"]) == want["text"]["logprobs"]
    assert json.loads(rows["many"]["choices"]) == want["many"]["choices"]
    assert rows["refused"]["refusal"] == "I can't help with that." and rows["tool"]["finish_reason"] == "tool_calls"
    assert rows["text"]["tool_calls"] == ""  # none made


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_full_adds_the_whole_response_as_the_provider_sent_it(store, tmp_path, chat_job, fmt):
    path = export_results(store, "tickets", tmp_path / f"out.{fmt}", full=True).path
    if fmt == "jsonl":
        got = {cid: r["response"] for cid, r in jsonl_rows(path).items()}  # an object, integers kept
    elif fmt == "parquet":
        got = {r["ticket_id"]: json.loads(r["response"]) for r in pq.read_table(path).to_pylist()}  # not one shape: JSON text
    else:
        with path.open(encoding="utf-8") as f:
            got = {r["ticket_id"]: json.loads(r["response"]) for r in csv.DictReader(f)}
    assert got == chat_answers()
    assert type(got["text"]["created"]) is int and type(got["text"]["usage"]["total_tokens"]) is int


SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["billing", "technical"]},
        "count": {"type": "integer"},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"$ref": "#/$defs/place"},
        "extra": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    },
    "required": ["label", "count"],
    "$defs": {"place": {"type": "object", "properties": {"city": {"type": "string"}, "floor": {"type": "integer"}}}},
}
PARSED = {"label": "billing", "count": 3, "score": 2, "tags": ["a", "b"], "where": {"city": "Oslo", "floor": 4}, "extra": 7}


def test_parsed_fields_are_typed_from_the_schema_and_stay_integers(store, clock, tmp_path, monkeypatch):
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ["a", "b"], response_schema=SCHEMA)
    a.answer_all(store, job, {"a": a.chat(a.choice(0, json.dumps(PARSED))), "b": a.chat(a.choice(0, json.dumps({"label": "technical", "count": 1})))})
    export_results(store, "tickets", tmp_path / "out.jsonl")
    out = jsonl_rows(tmp_path / "out.jsonl")
    assert {k: out["a"][k] for k in PARSED} == PARSED and type(out["a"]["count"]) is int and type(out["a"]["where"]["floor"]) is int
    export_results(store, "tickets", tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    types = {f: table.schema.field(f).type for f in PARSED}
    assert types == {
        "label": pa.string(), "count": pa.int64(), "score": pa.float64(), "tags": pa.list_(pa.string()),
        "where": pa.struct([("city", pa.string()), ("floor", pa.int64())]),
        "extra": pa.string(),  # a union has no one Arrow type: JSON text
    }  # fmt: skip
    rows = {r["ticket_id"]: r for r in table.to_pylist()}
    assert {k: rows["a"][k] for k in PARSED} == PARSED | {"score": 2.0, "extra": "7"}
    assert rows["b"]["tags"] is None and rows["b"]["count"] == 1


def test_a_non_object_schema_is_one_parsed_column(store, clock, tmp_path, monkeypatch):
    schema = {"type": "array", "items": {"type": "integer"}}
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ["a"], response_schema=schema)
    a.answer_all(store, job, {"a": a.chat(a.choice(0, "[1, 2, 30]"))})
    export_results(store, "tickets", tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.field("parsed").type == pa.list_(pa.int64()) and table.column("parsed").to_pylist() == [[1, 2, 30]]


def test_responses_answers_are_read_from_their_output_items(store, clock, tmp_path, monkeypatch):
    endpoint = "/v1/responses"
    params = {"max_output_tokens": 64, "tools": [a.weather_tool(endpoint)]}
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ["said", "called"], endpoint=endpoint, params=params)
    a.answer_all(store, job, {
        "said": a.response(a.response_reasoning("the ticket mentions an invoice"), a.response_message("billing")),
        "called": a.response(a.response_call("call_9", "get_weather", a.args(city="Rome"))),
    })  # fmt: skip
    export_results(store, "tickets", tmp_path / "out.jsonl")
    out = jsonl_rows(tmp_path / "out.jsonl")
    assert out["said"]["output"] == "billing" and out["said"]["finish_reason"] == "completed"
    assert out["said"]["reasoning"] == "the ticket mentions an invoice" and out["said"]["tool_calls"] is None
    assert out["called"]["state"] == "succeeded"
    assert out["called"]["tool_calls"] == [{"id": "call_9", "type": "function", "name": "get_weather", "arguments": a.args(city="Rome")}]


def test_anthropic_answers_are_read_from_their_content_blocks(store, clock, tmp_path, monkeypatch):
    endpoint = "/v1/messages"
    params = {"max_tokens": 64, "tools": [a.weather_tool(endpoint)]}
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ["said", "called"], endpoint=endpoint, params=params)
    a.answer_all(store, job, {
        "said": a.message(a.thinking_block("an invoice, so billing"), a.text_block("billing")),
        "called": a.message(a.text_block("Let me check."), a.tool_use("toolu_1", "get_weather", {"city": "Lima", "days": 2}), stop="tool_use"),
    })  # fmt: skip
    export_results(store, "tickets", tmp_path / "out.parquet")
    rows = {r["ticket_id"]: r for r in pq.read_table(tmp_path / "out.parquet").to_pylist()}
    assert rows["said"]["reasoning"] == "an invoice, so billing" and rows["said"]["finish_reason"] == "end_turn"
    assert rows["called"]["state"] == "succeeded" and rows["called"]["finish_reason"] == "tool_use"
    (call,) = rows["called"]["tool_calls"]
    assert call["id"] == "toolu_1" and call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Lima", "days": 2}


def test_completions_logprobs_become_one_entry_per_token(store, clock, tmp_path, monkeypatch):
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ["a"], endpoint="/v1/completions", params={"max_tokens": 2, "logprobs": 1})
    a.answer_all(store, job, {"a": a.completion("ab", [("a", -1.0), ("b", -0.5)])})
    export_results(store, "tickets", tmp_path / "out.jsonl")
    out = jsonl_rows(tmp_path / "out.jsonl")["a"]
    assert out["output"] == "ab" and out["finish_reason"] == "length"
    assert out["logprobs"] == [
        {"token": "a", "logprob": -1.0, "bytes": None, "top_logprobs": [{"token": "a", "logprob": -1.0, "bytes": None}]},
        {"token": "b", "logprob": -0.5, "bytes": None, "top_logprobs": [{"token": "b", "logprob": -0.5, "bytes": None}]},
    ]


def test_huge_answers_are_exported_a_page_at_a_time(store, clock, tmp_path, monkeypatch):
    """Answers of ~0.5 MB of logprobs each, with pages of 0.6 MB: the export holds one
    decoded answer at a time, not the chunk's twelve."""
    ids = [f"r{i:02}" for i in range(12)]
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ids)
    tokens = [(f"t{i}", -0.5, [(f"t{i}", -0.5)]) for i in range(4000)]
    body = a.chat(a.choice(0, "x" * 10, logprobs=tokens))
    a.answer_all(store, job, dict.fromkeys(ids, body))
    assert all(len(r.response) > 500_000 for r in a.states(store).values())
    monkeypatch.setattr(export, "PAGE_BYTES", 600_000)
    assert [len(page) for page in ResultRows(store, "tickets").chunks()] == [1] * 12
    stored = json.dumps(body)
    one = traced_peak(lambda: answer_values(json.loads(stored)))  # what one decoded answer costs
    export_results(store, "tickets", tmp_path / "out.parquet")  # modules imported, caches filled: not counted
    peak = traced_peak(lambda: export_results(store, "tickets", tmp_path / "out.parquet"))
    assert peak < 4 * one, f"peak {peak / 1e6:.0f} MB; one answer decoded: {one / 1e6:.0f} MB"
    assert len(pq.read_table(tmp_path / "out.parquet", columns=["logprobs"]).column("logprobs")[11].as_py()) == 4000


def traced_peak(work) -> int:
    tracemalloc.start()
    try:
        keep = work()  # held until the peak is read, as the export holds its page
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del keep
    return peak


NULLABLE = {
    "type": "object",
    "properties": {
        "name": {"type": ["string", "null"]},  # OpenAI's usual optional field
        "age": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "either": {"type": ["string", "integer"]},  # a real union: JSON text
    },
    "required": ["name", "age", "either"],
}


def test_nullable_unions_export_to_parquet_as_their_one_type(store, clock, tmp_path, monkeypatch):
    """At 2c0e660 `type: [string, null]` crashed the Parquet export after the paid run
    (TypeError: unhashable type: 'list'; rc 3, no results file)."""
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ["a", "b"], response_schema=NULLABLE)
    a.answer_all(store, job, {"a": a.chat(a.choice(0, json.dumps({"name": "Ada", "age": 36, "either": 1}))),
                              "b": a.chat(a.choice(0, json.dumps({"name": None, "age": None, "either": "x"})))})  # fmt: skip
    export_results(store, "tickets", tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert {f: table.schema.field(f).type for f in NULLABLE["properties"]} == {"name": pa.string(), "age": pa.int64(), "either": pa.string()}
    rows = {r["ticket_id"]: r for r in table.to_pylist()}
    assert (rows["a"]["name"], rows["a"]["age"], rows["a"]["either"]) == ("Ada", 36, "1")
    assert (rows["b"]["name"], rows["b"]["age"], rows["b"]["either"]) == (None, None, "x")
