"""An embedding job end to end on the `echo` route (direct), real SQLite store."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from lowtide.core.embeddings import vector_of
from lowtide.core.spec import build_spec
from lowtide.store.payloads import payload_text
from lowtide.store.schema import attempts, requests
from tests.conftest import drive_to_end
from tests.embeddings.helpers import docs_csv, echo_reference, embed_spec


def stored(store) -> dict[str, dict]:
    with store.begin() as conn:
        rows = conn.execute(select(requests.c.source_key, requests.c.state, requests.c.response, payload_text().label("payload"),
                                   requests.c.input_tokens)).all()  # fmt: skip
    return {r.source_key: {"state": r.state, "response": json.loads(r.response) if r.response else None,
                           "payload": json.loads(r.payload), "tokens": r.input_tokens} for r in rows}  # fmt: skip


@pytest.mark.parametrize("packing", [True, False])
def test_vectors_are_the_echo_function_of_each_row(sqlite_store, clock, tmp_path, packing):
    source = docs_csv(tmp_path / "docs.csv", 30)
    spec = build_spec(embed_spec(source, packing=packing))
    status = drive_to_end(sqlite_store, spec, clock)
    assert status.counts.get("succeeded") == 30
    rows = stored(sqlite_store)
    for row in rows.values():
        text = row["payload"]["body"]["input"]
        assert row["payload"]["body"] == {"model": "text-embedding-3-small", "dimensions": 8, "input": text}  # one row per stored request
        assert vector_of(row["response"]) == echo_reference(text, 8)
        packed = row["response"].get("lowtide_pack")
        assert (packed is not None) == packing
    if packing:  # one pack of 30: the pack's usage is shared out exactly
        pack = next(iter(rows.values()))["response"]["lowtide_pack"]
        assert pack["size"] == 30
        assert sum(r["tokens"] for r in rows.values()) == pack["usage"]["prompt_tokens"]


def test_base64_vectors_decode_to_the_same_floats_in_float32(sqlite_store, clock, tmp_path):
    import struct

    source = docs_csv(tmp_path / "docs.csv", 5)
    spec = build_spec(embed_spec(source, params={"dimensions": 4, "encoding_format": "base64"}))
    drive_to_end(sqlite_store, spec, clock)
    for row in stored(sqlite_store).values():
        raw = row["response"]["data"][0]["embedding"]
        assert isinstance(raw, str)
        want = [struct.unpack("<f", struct.pack("<f", x))[0] for x in echo_reference(row["payload"]["body"]["input"], 4)]
        assert vector_of(row["response"]) == want


def test_rerun_adds_only_new_rows_and_bills_once(sqlite_store, clock, tmp_path):
    source = docs_csv(tmp_path / "docs.csv", 10)
    spec = build_spec(embed_spec(source))
    drive_to_end(sqlite_store, spec, clock)
    docs_csv(source, 15)  # 5 new rows
    drive_to_end(sqlite_store, spec, clock)
    rows = stored(sqlite_store)
    assert len(rows) == 15 and all(r["state"] == "succeeded" for r in rows.values())
    with sqlite_store.begin() as conn:
        assert len(conn.execute(select(attempts.c.id)).all()) == 15
