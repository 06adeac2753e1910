"""Embedding jobs through `lowtide serve` (echo backend, fast clock) with the official openai
SDK: the `openai-batch` route packs rows into `/v1/embeddings` batch lines and unpacks the
answers per row; serve's own output lines have OpenAI's shape."""

from __future__ import annotations

import json

import openai
from sqlalchemy import func, select

from lowtide.core.clock import ManualClock
from lowtide.core.embeddings import decode, vector_of
from lowtide.core.spec import build_spec
from lowtide.engine.loader import load_job
from lowtide.engine.report import cost_report
from lowtide.store.db import Store
from lowtide.store.payloads import payload_text
from lowtide.store.schema import attempts, dispatches, requests
from tests.embeddings.helpers import docs_csv, echo_reference, embed_spec
from tests.routes.conftest import KEY_ENV, _options, _run, serve  # noqa: F401  (serve: the fixture)


def test_openai_batch_packs_rows_and_unpacks_each_vector_to_its_row(serve, tmp_path):  # noqa: F811
    url = serve()
    source = docs_csv(tmp_path / "docs.csv", 120)
    store = Store(str(tmp_path / "client.db"))
    # two batches of 60 rows (chunk_size), each sent as one pack of 60 inputs
    spec = build_spec(embed_spec(source, route="openai-batch", route_options=_options("openai-batch", url), chunk_size=60))
    load_job(store, spec, ManualClock())
    assert _run(store, "vectors").counts == {"succeeded": 120}
    with store.begin() as conn:
        rows = conn.execute(select(payload_text().label("payload"), requests.c.response, requests.c.input_tokens)).all()
        batches = conn.execute(select(func.count()).select_from(dispatches)).scalar_one()
        ledger = conn.execute(select(attempts.c.input_tokens, attempts.c.output_tokens, attempts.c.cost_picousd,
                                     attempts.c.realtime_picousd, attempts.c.tier)).all()  # fmt: skip
    assert batches == 2
    # Input tokens only, at the batch tier: $0.01 per million tokens is 10,000 picodollars a
    # token; real time would have been twice that.
    assert {a.tier for a in ledger} == {"batch"} and all(a.output_tokens == 0 for a in ledger)
    assert all(a.cost_picousd == a.input_tokens * 10_000 and a.realtime_picousd == 2 * a.cost_picousd for a in ledger)
    report = cost_report(store, job="vectors").total  # `lowtide report`'s figures
    assert report.input_tokens == sum(a.input_tokens for a in ledger) and report.output_tokens == 0
    assert report.cost_picousd == report.input_tokens * 10_000 and report.tiers == {"batch"} and report.unknown == 0
    for payload, response, tokens in rows:
        text = json.loads(payload)["body"]["input"]
        kept = json.loads(response)
        assert vector_of(kept) == echo_reference(text, 8)
        assert kept["lowtide_pack"]["size"] == 60 and kept["model"] == "text-embedding-3-small"
        assert tokens == kept["usage"]["prompt_tokens"]


def test_serve_answers_an_sdk_embeddings_batch_in_openais_line_shape(serve, tmp_path):  # noqa: F811
    url = serve()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="test-key", max_retries=0)
    lines = [
        {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": "text-embedding-3-small", "input": "hello", "dimensions": 4}},
        {"custom_id": "b", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "text-embedding-3-small", "input": ["one", "two"], "dimensions": 3, "encoding_format": "base64"}},
        {"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": {"model": "text-embedding-3-small", "input": "   "}},
    ]  # fmt: skip
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    file = client.files.create(file=("in.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h")
    from tests.conftest import wait_until

    done = wait_until(lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b, what="the batch")
    assert done.status == "completed", done
    out = {}
    for f in (done.output_file_id, done.error_file_id):
        if f:
            for line in client.files.content(f).text.splitlines():
                item = json.loads(line)
                out[item["custom_id"]] = item
    a = out["a"]["response"]
    assert a["status_code"] == 200 and out["a"]["error"] is None and set(out["a"]) == {"id", "custom_id", "response", "error"}
    body = a["body"]
    assert body["object"] == "list" and body["model"] == "text-embedding-3-small"
    assert body["data"] == [{"object": "embedding", "index": 0, "embedding": echo_reference("hello", 4)}]
    assert body["usage"] == {"prompt_tokens": 2, "total_tokens": 2}
    b = out["b"]["response"]["body"]["data"]
    assert [d["index"] for d in b] == [0, 1] and all(isinstance(d["embedding"], str) for d in b)
    assert [len(decode(d["embedding"])) for d in b] == [3, 3]
    c = out["c"]["response"]
    assert c["status_code"] == 400 and "input" in c["body"]["error"]["message"]


def test_serve_on_the_local_backend_embeds_with_the_embedded_model_and_refuses_what_it_lacks(serve, tmp_path):  # noqa: F811
    from lowtide.routes.own.local_embed import embedder  # noqa: PLC0415

    url = serve("--backend", "local")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="test-key", max_retries=0)
    lines = [
        {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": "all-MiniLM-L6-v2", "input": "hello"}},
        {"custom_id": "b", "method": "POST", "url": "/v1/embeddings", "body": {"model": "all-MiniLM-L6-v2", "input": "hi", "user": "u"}},
        {"custom_id": "c", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "all-MiniLM-L6-v2", "input": "hello", "dimensions": 64}},
    ]  # fmt: skip
    file = client.files.create(file=("in.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode()), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h")
    from tests.conftest import wait_until

    done = wait_until(lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b, what="the batch")
    out = {}
    for f in (done.output_file_id, done.error_file_id):
        for line in client.files.content(f).text.splitlines() if f else []:
            item = json.loads(line)
            out[item["custom_id"]] = item["response"]
    assert out["a"]["status_code"] == 200, out
    (vector,) = [d["embedding"] for d in out["a"]["body"]["data"]]
    assert max(abs(x - y) for x, y in zip(vector, embedder().embed(["hello"])[0], strict=True)) < 1e-5
    assert out["b"]["status_code"] == 400 and out["b"]["body"]["error"]["message"].startswith("user: not honoured by the local route")
    assert out["c"]["status_code"] == 400 and out["c"]["body"]["error"]["message"].startswith("dimensions: all-MiniLM-L6-v2 makes vectors of 384")
