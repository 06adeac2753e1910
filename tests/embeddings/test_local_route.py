"""Embedding jobs on the `local` route: the embedded all-MiniLM-L6-v2, no key, no network.
Vectors are the embedded model's own (routes/local_embed), checked against a direct call;
what the model cannot honour is refused by name before anything is stored."""

from __future__ import annotations

import json
import math

import pytest
from sqlalchemy import func, select

from lowtide.core.errors import LowtideError
from lowtide.core.spec import build_spec
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.routes.own.local_embed import embedder
from lowtide.store.payloads import payload_text
from lowtide.store.schema import requests
from tests.conftest import drive_to_end
from tests.embeddings.helpers import docs_csv, embed_spec

pytest.importorskip("onnxruntime")
MODEL = "all-MiniLM-L6-v2"


def local_spec(source, **over) -> dict:
    return embed_spec(source, **over) | {"model": MODEL, "route": "local", "params": over.get("params", {})}


@pytest.mark.parametrize("packing", [True, False])
def test_a_local_embedding_job_stores_the_models_own_vectors(sqlite_store, clock, tmp_path, packing):
    source = docs_csv(tmp_path / "docs.csv", 12)
    status = drive_to_end(sqlite_store, build_spec(local_spec(source, packing=packing)), clock)
    assert status.counts == {"succeeded": 12}
    with sqlite_store.begin() as conn:
        rows = conn.execute(select(payload_text().label("payload"), requests.c.response, requests.c.input_tokens)).all()
    model = embedder()
    for payload, response, tokens in rows:
        text = json.loads(payload)["body"]["input"]
        vector = json.loads(response)["data"][0]["embedding"] if not packing else None
        got = vector or _vector_of_pack(json.loads(response))
        want = model.embed([text])[0]
        assert len(got) == 384 and max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-5
        assert math.isclose(math.sqrt(sum(v * v for v in got)), 1.0, rel_tol=1e-4)
        assert tokens > 0
    out = export_results(sqlite_store, "vectors", tmp_path / "v.parquet")
    assert out.rows == 12


def _vector_of_pack(response: dict) -> list[float]:
    from lowtide.core.embeddings import vector_of

    return vector_of(response)


@pytest.mark.parametrize(("params", "said"), [
    ({"dimensions": 128}, "params.dimensions: all-MiniLM-L6-v2 does not take `dimensions` (its vectors have 384)"),  # the spec's check
    ({"user": "u1"}, "user: not honoured by the local route's embedding model"),  # the route's, per row
])  # fmt: skip
def test_what_the_local_model_cannot_honour_is_refused_by_name_and_nothing_stored(sqlite_store, clock, tmp_path, params, said):
    source = docs_csv(tmp_path / "docs.csv", 3)
    with pytest.raises(LowtideError) as err:
        load_job(sqlite_store, build_spec(local_spec(source, params=params)), clock)
    assert said in str(err.value)
    with sqlite_store.begin() as conn:
        assert conn.execute(select(func.count()).select_from(requests)).scalar_one() == 0


def test_an_input_over_256_tokens_is_refused_with_its_exact_count_or_cut_when_asked(sqlite_store, clock, tmp_path):
    long_text = "word " * 400  # 402 tokens with [CLS] and [SEP]
    source = tmp_path / "docs.csv"
    source.write_text(f"doc_id,text\nd1,short text\nd2,{long_text}\n")
    with pytest.raises(LowtideError) as err:
        load_job(sqlite_store, build_spec(local_spec(source)), clock)
    assert "row 2" in str(err.value) and f"{embedder().count_tokens(long_text)} tokens" in str(err.value)
    assert "truncate: true" in str(err.value)
    status = drive_to_end(sqlite_store, build_spec(local_spec(source, truncate=True)), clock)
    assert status.counts == {"succeeded": 2}
    with sqlite_store.begin() as conn:
        cut = [json.loads(p)["body"]["input"] for (p,) in conn.execute(select(payload_text().label("payload")))]
    assert all(embedder().count_tokens(text) <= 256 for text in cut) and any(len(t) < len(long_text) for t in cut)


def test_the_chat_model_is_not_asked_for_vectors_nor_the_embedding_model_for_text(tmp_path):
    from lowtide.core.types import Request
    from lowtide.routes import create_route

    route = create_route("local", {})
    chat = Request.chat("c1", MODEL, [{"role": "user", "content": "hi"}])
    assert route.refusal(chat).field == "model"
    vectors = Request("e1", "/v1/embeddings", {"model": "smollm2-135m-instruct", "input": "hi"})
    assert route.refusal(vectors).field == "model"


def test_a_model_folder_of_ones_own_takes_its_own_model_name(tmp_path):
    from lowtide.routes import create_route
    from lowtide.routes.own.local_embed.files import default_files

    files = default_files()
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "model.onnx").symlink_to(files.onnx)
    (folder / "tokenizer.json").symlink_to(files.tokenizer)
    route = create_route("local", {"embedding_model_path": str(folder)})
    route.check_model("my-minilm")  # no RouteError: the folder is the model
    from lowtide.core.types import Request

    assert route.refusal(Request("e1", "/v1/embeddings", {"model": "my-minilm", "input": "hi"})) is None
