"""What a job spec can say reaches the stored body: per-row params (`param_columns`), images
and files (`template.images` / `template.files`), native conversations (`messages_column`).

Loaded into a real SQLite store with `load_job`; provider routes are built (they check
their key) but nothing is sent: invariant 1, nothing reaches the network at load.
"""

from __future__ import annotations

import base64
import json

import pytest
import sqlalchemy as sa

from lowtide.core.errors import InputError
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.store.payloads import payload_text
from lowtide.store.schema import requests
from tests.conftest import make_spec, whole_columns, write_csv
from tests.core.test_parts import PDF, PNG


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")


def stored(store) -> dict[str, dict]:
    with store.begin() as conn:
        return {r.custom_id: json.loads(r.payload) | {"fp": r.fingerprint} for r in conn.execute(sa.select(*whole_columns(requests)))}


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_param_columns_fill_body_params_typed_as_the_sdk_says(sqlite_store, clock, tmp_path):
    rows = [
        {"ticket_id": "A", "body": "x", "seed": "7", "t": "0.25", "lp": "true", "eff": "low"},
        {"ticket_id": "B", "body": "y", "seed": "", "t": "", "lp": "", "eff": ""},  # empty: the spec's value
    ]
    source = write_csv(tmp_path / "t.csv", rows)
    spec = make_spec(
        source, route="openai-batch",
        param_columns={"seed": "seed", "temperature": "t", "logprobs": "lp", "reasoning_effort": "eff"},
        params={"max_completion_tokens": 50, "temperature": 1.0},
    )  # fmt: skip
    assert load_job(sqlite_store, spec, clock).new == 2
    got = stored(sqlite_store)
    a, b = got["A"]["body"], got["B"]["body"]
    assert (a["seed"], a["temperature"], a["logprobs"], a["reasoning_effort"]) == (7, 0.25, True, "low")
    assert type(a["seed"]) is int and type(a["temperature"]) is float
    assert b["temperature"] == 1.0 and "seed" not in b and "logprobs" not in b
    assert a["max_completion_tokens"] == b["max_completion_tokens"] == 50


def test_param_columns_from_jsonl_are_taken_as_they_are_and_change_the_fingerprint(sqlite_store, clock, tmp_path):
    tools = [{"type": "function", "function": {"name": "tag", "parameters": {"type": "object"}}}]
    path = jsonl(tmp_path / "t.jsonl", [{"ticket_id": "A", "body": "x", "stop": ["##"], "tools": tools}])
    spec = make_spec(path, route="openai-batch", param_columns={"stop": "stop", "tools": "tools"})
    load_job(sqlite_store, spec, clock)
    first = stored(sqlite_store)["A"]
    assert first["body"]["stop"] == ["##"] and first["body"]["tools"] == tools
    jsonl(path, [{"ticket_id": "A", "body": "x", "stop": ["%%"], "tools": tools}])
    report = load_job(sqlite_store, spec, clock)
    assert report.changed == 1  # the column is part of what the row renders from


def test_images_and_files_become_native_parts_on_each_endpoint(sqlite_store, clock, tmp_path):
    (tmp_path / "a.png").write_bytes(PNG)
    (tmp_path / "c.pdf").write_bytes(PDF)
    rows = [{"ticket_id": "A", "body": "x", "photo": "a.png", "doc": "c.pdf"},
            {"ticket_id": "B", "body": "y", "photo": "https://example.com/b.jpg", "doc": base64.b64encode(PDF).decode()}]  # fmt: skip
    source = write_csv(tmp_path / "t.csv", rows)
    template = {"images": [{"column": "photo", "detail": "low"}], "files": [{"column": "doc"}]}
    spec = make_spec(source, route="openai-batch", base_dir=str(tmp_path), template=template)
    load_job(sqlite_store, spec, clock)
    got = stored(sqlite_store)
    user = got["A"]["body"]["messages"][-1]
    png = base64.b64encode(PNG).decode()
    assert user["content"] == [
        {"type": "text", "text": "Ticket: x"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}", "detail": "low"}},
        {"type": "file", "file": {"filename": "c.pdf", "file_data": f"data:application/pdf;base64,{base64.b64encode(PDF).decode()}"}},
    ]
    assert got["B"]["body"]["messages"][-1]["content"][1]["image_url"]["url"] == "https://example.com/b.jpg"
    assert got["A"]["body"]["messages"][0] == {"role": "system", "content": "Classify the ticket."}

    spec = make_spec(source, name="claude", route="anthropic-batch", base_dir=str(tmp_path), template={"images": [{"column": "photo"}], "files": [{"column": "doc"}]})
    load_job(sqlite_store, spec, clock)
    with sqlite_store.begin() as conn:
        payload = json.loads(conn.execute(sa.select(payload_text().label("payload")).where(requests.c.job_id == 2, requests.c.custom_id == "A")).scalar_one())
    assert payload["endpoint"] == "/v1/messages"
    assert payload["body"]["system"] == "Classify the ticket."
    assert payload["body"]["messages"][0]["content"][1:] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(PDF).decode()}},
    ]


def test_a_file_replaced_behind_a_cell_is_a_changed_row_in_the_load_and_the_results(store, clock, tmp_path):
    """DESIGN invariant 9: the bytes a path cell inlines are what the row renders from. A photo
    swapped under the same name was "already stored", and its old bytes kept and sent."""
    (tmp_path / "a.png").write_bytes(PNG)
    (tmp_path / "c.pdf").write_bytes(PDF)
    rows = [{"ticket_id": "A", "body": "x", "photo": "a.png", "doc": "c.pdf"},
            {"ticket_id": "B", "body": "y", "photo": "https://example.com/b.jpg", "doc": base64.b64encode(PDF).decode()}]  # fmt: skip
    source = write_csv(tmp_path / "t.csv", rows)
    template = {"images": [{"column": "photo"}], "files": [{"column": "doc"}]}
    spec = make_spec(source, route="openai-batch", base_dir=str(tmp_path), template=template)

    def changed_in_results() -> dict[str, bool]:
        export_results(store, "tickets", tmp_path / "out.jsonl")
        return {r["custom_id"]: r["source_changed"] for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}

    assert load_job(store, spec, clock).new == 2
    assert changed_in_results() == {"A": False, "B": False}
    other = PNG + b"another photo"
    (tmp_path / "a.png").write_bytes(other)  # the photo is replaced; the cell still says a.png
    report = load_job(store, spec, clock)
    assert (report.new, report.changed, report.requeued) == (0, 1, 0)
    assert changed_in_results() == {"A": True, "B": False}

    assert load_job(store, spec, clock, requeue_changed=True).requeued == 1
    assert stored(store)["A"]["body"]["messages"][-1]["content"][1]["image_url"]["url"] == f"data:image/png;base64,{base64.b64encode(other).decode()}"
    assert changed_in_results() == {"A": False, "B": False}
    (tmp_path / "c.pdf").write_bytes(PDF + b"%% page 2")  # and the PDF
    assert load_job(store, spec, clock).changed == 1
    assert changed_in_results() == {"A": True, "B": False}


def test_a_user_template_without_variables_still_gets_the_rows_parts(sqlite_store, clock, tmp_path):
    # The same question for every photo: a constant user text, rendered once. Its images
    # were dropped silently (the body went out as text alone), and echo took the job.
    (tmp_path / "a.png").write_bytes(PNG)
    source = write_csv(tmp_path / "t.csv", [{"ticket_id": "A", "photo": "a.png"}])
    template = {"system": None, "user": "What is in this photo?", "images": [{"column": "photo"}]}
    spec = make_spec(source, route="openai-batch", base_dir=str(tmp_path), template=template)
    load_job(sqlite_store, spec, clock)
    png = base64.b64encode(PNG).decode()
    assert stored(sqlite_store)["A"]["body"]["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "What is in this photo?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
    ]}]  # fmt: skip

    with pytest.raises(InputError, match=r"content part 'image_url' is not taken by this route \(text only\) \(route echo\)"):
        load_job(sqlite_store, make_spec(source, name="on-echo", base_dir=str(tmp_path), template=template), clock)


def test_parquet_binary_cells_are_images(sqlite_store, clock, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"ticket_id": ["A"], "body": ["x"], "photo": pa.array([PNG], pa.binary())}), tmp_path / "t.parquet")
    spec = make_spec(tmp_path / "t.parquet", route="openai-batch", template={"images": [{"column": "photo"}]})
    load_job(sqlite_store, spec, clock)
    part = stored(sqlite_store)["A"]["body"]["messages"][-1]["content"][1]
    assert part == {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()}}


def test_a_native_conversation_is_stored_verbatim(sqlite_store, clock, tmp_path):
    conversation = [
        {"role": "developer", "content": [{"type": "text", "text": "Be terse."}]},
        {"role": "user", "content": [{"type": "text", "text": "weather?"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "wx", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    path = jsonl(tmp_path / "c.jsonl", [{"ticket_id": "A", "conv": conversation}])
    spec = make_spec(path, route="openai-batch", template={"system": None, "user": None, "messages_column": "conv"})
    load_job(sqlite_store, spec, clock)
    assert stored(sqlite_store)["A"]["body"]["messages"] == conversation


def test_an_anthropic_conversation_with_blocks_and_cache_control_is_stored_verbatim(sqlite_store, clock, tmp_path):
    conversation = [
        {"role": "user", "content": [{"type": "text", "text": "long doc", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "look", "input": {"q": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "found"}]},
    ]
    path = jsonl(tmp_path / "c.jsonl", [{"ticket_id": "A", "conv": conversation}])
    spec = make_spec(path, route="anthropic-batch", template={"system": None, "user": None, "messages_column": "conv"})
    load_job(sqlite_store, spec, clock)
    body = stored(sqlite_store)["A"]["body"]
    assert body["messages"] == conversation and "system" not in body


def test_the_tag_products_example_loads_with_its_parts_tools_and_seeds(sqlite_store, clock):
    from pathlib import Path

    from lowtide.core.spec import load_spec

    spec = load_spec(Path(__file__).parents[2] / "examples" / "tag-products.yaml")
    assert load_job(sqlite_store, spec, clock).new == 3
    got = stored(sqlite_store)
    mug = got["SKU-1001"]["body"]
    assert mug["seed"] == 1 and "seed" not in got["SKU-1003"]["body"]
    assert mug["tool_choice"] == {"type": "function", "function": {"name": "tag_product"}}
    image = mug["messages"][-1]["content"][1]["image_url"]
    assert image["url"].startswith("data:image/png;base64,") and image["detail"] == "low"
    assert got["SKU-1003"]["body"]["messages"][-1]["content"][1]["image_url"]["url"].startswith("https://")


def test_rows_own_anthropic_requests_without_max_tokens_are_refused_by_row_before_anything_is_stored(sqlite_store, clock, tmp_path):
    # The spec cannot know whether rows that bring their own conversation or body give a
    # required key: before, such a load stored every row and each one failed at Anthropic.
    from lowtide.core.spec import build_spec

    turn = [{"role": "user", "content": "hi"}]
    path = jsonl(tmp_path / "c.jsonl", [
        {"ticket_id": "A", "conv": turn}, {"ticket_id": "B", "conv": turn, "max_tokens": 64}, {"ticket_id": "C", "conv": turn},
    ])  # fmt: skip
    base = {"name": "convs", "source": {"path": str(path), "id_column": "ticket_id"}, "model": "claude-haiku-4-5",
            "route": "anthropic-batch", "template": {"messages_column": "conv"}}  # fmt: skip
    with pytest.raises(InputError) as info:
        load_job(sqlite_store, build_spec(base), clock)
    said = str(info.value)
    assert 'c.jsonl rows 1, 3: max_tokens is required by /v1/messages and the request has none' in said
    assert "set params.max_tokens in the spec (e.g. params: {max_tokens: 1024}), or give it as the row's \"max_tokens\" column" in said
    assert stored(sqlite_store) == {}

    bodies = jsonl(tmp_path / "b.jsonl", [{"ticket_id": "A", "req": {"messages": turn}}])
    with pytest.raises(InputError, match=r'b.jsonl row 1: max_tokens is required .* or give it in column "req"'):
        load_job(sqlite_store, build_spec(base | {"name": "bodies", "source": {"path": str(bodies), "id_column": "ticket_id"},
                                                  "template": {"body_column": "req"}}), clock)  # fmt: skip

    assert load_job(sqlite_store, build_spec(base | {"params": {"max_tokens": 32}}), clock).new == 3
    assert {k: v["body"]["max_tokens"] for k, v in stored(sqlite_store).items()} == {"A": 32, "B": 64, "C": 32}


def test_a_key_the_sdk_does_not_declare_is_carried_and_the_load_says_so_once(sqlite_store, clock, tmp_path):
    from lowtide.store.schema import events

    source = write_csv(tmp_path / "t.csv", [{"ticket_id": "A", "body": "x"}, {"ticket_id": "B", "body": "y"}])
    spec = make_spec(source, route="anthropic-batch", model="claude-haiku-4-5", params={"a_key_no_sdk_declares": 1})
    load_job(sqlite_store, spec, clock)
    load_job(sqlite_store, spec, clock)
    assert all(v["body"]["a_key_no_sdk_declares"] == 1 for v in stored(sqlite_store).values())
    with sqlite_store.begin() as conn:
        said = conn.execute(sa.select(events.c.message).where(events.c.kind == "carried_param")).scalars().all()
    assert len(said) == 1 and said[0].startswith("`a_key_no_sdk_declares` is not a parameter of /v1/messages")


@pytest.mark.parametrize(("route", "model"), [("openai-batch", "gpt-4o-mini"), ("anthropic-batch", "claude-haiku-4-5")])
def test_the_headline_example_moves_to_a_provider_by_changing_route_and_model_only(sqlite_store, clock, route, model):
    # Its comment promises it; with max_tokens 4 the native {"choice": ...} ask was refused
    # as too short on every provider route.
    from pathlib import Path

    from lowtide.core.spec import load_spec

    spec = load_spec(Path(__file__).parents[2] / "examples" / "classify-tickets.yaml")
    moved = spec.model_copy(update={"route": route, "model": model})
    report = load_job(sqlite_store, moved, clock)
    assert report.new == report.rows > 0
