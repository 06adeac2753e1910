"""Per-row `dimensions` on embedding batches (issue 33, item 5): a row's own `dimensions`
(its param column, or its own body) is the length its vector is checked against, else the
job's, else the model's own; on an `openai-batch` job against serve, and on serve with
`--backend openai-batch` (a batch an SDK sends through it to a second serve)."""

from __future__ import annotations

import json

import openai
from sqlalchemy import select

from lowtide.core.clock import ManualClock
from lowtide.core.embeddings import vector_of
from lowtide.core.spec import build_spec
from lowtide.engine.loader import load_job
from lowtide.store.db import Store
from lowtide.store.payloads import payload_text
from lowtide.store.schema import requests
from tests.conftest import wait_until, write_csv
from tests.embeddings.helpers import echo_reference, embed_spec
from tests.routes.conftest import KEY_ENV, _options, _run, serve  # noqa: F401  (serve: the fixture)

SIZES = {"doc-1": 4, "doc-2": 12, "doc-3": "", "doc-4": 4, "doc-5": 6}  # "": the job's own dimensions (8)


def _vectors(store: Store) -> dict[str, tuple[str, list[float], str]]:
    with store.begin() as conn:
        rows = conn.execute(select(requests.c.custom_id, requests.c.state, payload_text().label("payload"), requests.c.response)).all()
    return {r.custom_id: (r.state, vector_of(json.loads(r.response)) if r.response else [], json.loads(r.payload)["body"]["input"])
            for r in rows}  # fmt: skip


def test_a_rows_dimensions_column_sets_its_vectors_length_on_openai_batch(serve, tmp_path):  # noqa: F811
    url = serve()
    rows = [{"doc_id": k, "text": f"document {k}", "dims": v} for k, v in SIZES.items()]
    source = write_csv(tmp_path / "docs.csv", rows)
    spec = build_spec(embed_spec(source, route="openai-batch", route_options=_options("openai-batch", url),
                                 param_columns={"dimensions": "dims"}))  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, ManualClock())
    assert _run(store, "vectors").counts == {"succeeded": 5}
    for cid, (state, vector, text) in _vectors(store).items():
        want = SIZES[cid] or 8
        assert state == "succeeded" and vector == echo_reference(text, want), cid


def test_a_body_columns_own_dimensions_are_honoured_on_openai_batch(serve, tmp_path):  # noqa: F811
    url = serve()
    rows = [{"doc_id": k, "body": json.dumps({"input": f"document {k}"} | ({"dimensions": v} if v else {}))} for k, v in SIZES.items()]
    source = write_csv(tmp_path / "bodies.csv", rows)
    data = embed_spec(source, route="openai-batch", route_options=_options("openai-batch", url), template={"body_column": "body"})
    data["params"] = {}
    store = Store(str(tmp_path / "client.db"))
    load_job(store, build_spec(data), ManualClock())
    assert _run(store, "vectors").counts == {"succeeded": 5}
    for cid, (state, vector, text) in _vectors(store).items():
        want = SIZES[cid] or 1536  # no dimensions anywhere: the model's own length
        assert state == "succeeded" and len(vector) == want and vector == echo_reference(text, want), cid


def test_serve_on_the_openai_batch_backend_honours_each_lines_dimensions(serve, tmp_path):  # noqa: F811
    upstream = serve()
    front = serve(
        "--backend", "openai-batch", "--db", str(tmp_path / "front.db"), "--data-dir", str(tmp_path / "front-data"),
        "-o", f"base_url={upstream}/v1", "-o", f"api_key_env={KEY_ENV}", "-o", "poll_interval=[0.05, 0.2]",
    )  # fmt: skip
    client = openai.OpenAI(base_url=f"{front}/v1", api_key="test-key", max_retries=0)
    lines = [
        {"custom_id": k, "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "text-embedding-3-small", "input": f"document {k}"} | ({"dimensions": v} if v else {})}
        for k, v in SIZES.items()
    ]  # fmt: skip
    file = client.files.create(file=("in.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode()), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h")
    done = wait_until(lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b, 120, "the batch")
    out = {}
    for f in (done.output_file_id, done.error_file_id):
        for line in client.files.content(f).text.splitlines() if f else []:
            item = json.loads(line)
            out[item["custom_id"]] = item["response"]
    for cid, size in SIZES.items():
        want = size or 1536
        assert out[cid]["status_code"] == 200, out[cid]
        assert out[cid]["body"]["data"][0]["embedding"] == echo_reference(f"document {cid}", want), cid
