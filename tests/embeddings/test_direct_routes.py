"""The `openai` and `openai-compatible` routes embed through the official openai SDK against
a real server: `lowtide serve --backend echo`'s real-time `/v1/embeddings`. And serve's
`openai-compatible` backend forwards `/v1/embeddings` batch lines to such an upstream."""

from __future__ import annotations

import json

import openai
import pytest
from sqlalchemy import select

from lowtide.core.clock import ManualClock
from lowtide.core.embeddings import vector_of
from lowtide.core.spec import build_spec
from lowtide.engine.loader import load_job
from lowtide.store.db import Store
from lowtide.store.payloads import payload_text
from lowtide.store.schema import requests
from tests.conftest import wait_until
from tests.embeddings.helpers import docs_csv, echo_reference, embed_spec
from tests.routes.conftest import KEY_ENV, _run, serve  # noqa: F401  (serve: the fixture)


@pytest.mark.parametrize("route", ["openai", "openai-compatible"])
def test_direct_routes_embed_packed_rows(route, serve, tmp_path):  # noqa: F811
    url = serve()
    source = docs_csv(tmp_path / "docs.csv", 25)
    store = Store(str(tmp_path / "client.db"))
    options = {"base_url": f"{url}/v1", "api_key_env": KEY_ENV}
    load_job(store, build_spec(embed_spec(source, route=route, route_options=options)), ManualClock())
    assert _run(store, "vectors").counts == {"succeeded": 25}
    with store.begin() as conn:
        for payload, response in conn.execute(select(payload_text().label("payload"), requests.c.response)):
            kept = json.loads(response)
            assert vector_of(kept) == echo_reference(json.loads(payload)["body"]["input"], 8)
            assert kept["lowtide_pack"]["size"] == 25


def test_serve_forwards_embedding_batches_to_an_openai_compatible_upstream(serve, tmp_path):  # noqa: F811
    upstream = serve()
    front = serve("--backend", "openai-compatible", "--option", f"base_url={upstream}/v1",
                  "--db", str(tmp_path / "front.db"), "--data-dir", str(tmp_path / "front-data"))  # its own store
    client = openai.OpenAI(base_url=f"{front}/v1", api_key="k", max_retries=0)
    line = {"custom_id": "x", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "text-embedding-3-small", "input": ["red", "green"], "dimensions": 5}}  # fmt: skip
    file = client.files.create(file=("in.jsonl", (json.dumps(line) + "\n").encode()), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h")
    done = wait_until(lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b, what="the batch")
    assert done.status == "completed" and done.output_file_id, done
    body = json.loads(client.files.content(done.output_file_id).text)["response"]["body"]
    assert [d["embedding"] for d in body["data"]] == [echo_reference("red", 5), echo_reference("green", 5)]
