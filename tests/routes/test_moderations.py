"""`/v1/moderations` batches: `lowtide serve` (echo backend) answers the official openai SDK's
batch in `ModerationCreateResponse`'s shape; a moderation job runs on `openai-batch` and
`openai` against it and exports each row's verdict; a route of another protocol refuses the
job at load, naming itself and the endpoint."""

from __future__ import annotations

import json
import os
import subprocess

import openai
import pytest
from openai.types.moderation import Moderation
from openai.types.moderation_create_response import ModerationCreateResponse

from lowtide.core.clock import ManualClock
from lowtide.core.errors import LowtideError
from lowtide.core.spec import build_spec
from lowtide.engine.loader import load_job
from lowtide.store.db import Store
from tests.conftest import wait_until, write_csv
from tests.routes.conftest import KEY_ENV, LOWTIDE, _options, _run, serve  # noqa: F401  (serve: the fixture)

MODEL = "omni-moderation-latest"


def _names(model) -> set[str]:
    """The keys an SDK model reads from JSON (its aliases: "self-harm/intent")."""
    return {field.alias or name for name, field in model.model_fields.items()}


def _check_verdict(verdict: dict) -> None:
    """One result as the SDK declares it: every category in each of its three maps, nothing flagged."""
    parsed = Moderation.model_validate(verdict)
    assert set(verdict) == _names(Moderation)
    for part in ("categories", "category_scores", "category_applied_input_types"):
        declared = Moderation.model_fields[part].annotation
        assert set(verdict[part]) == _names(declared), part
    assert parsed.flagged is False and not any(verdict["categories"].values())
    assert all(0 <= s < 0.01 for s in verdict["category_scores"].values())


def _rows(tmp_path, n: int = 4):
    return write_csv(tmp_path / "posts.csv", [{"post_id": f"p{i}", "text": f"post number {i}"} for i in range(n)])


def _spec(tmp_path, route: str, **more) -> dict:
    return {"name": "mod", "source": {"path": str(_rows(tmp_path)), "id_column": "post_id"}, "template": {"user": "{{ text }}"},
            "model": MODEL, "endpoint": "/v1/moderations", "route": route, **more}  # fmt: skip


def test_an_sdk_moderations_batch_completes_on_serve_in_the_sdks_response_shape(serve, tmp_path):  # noqa: F811
    url = serve()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="test-key", max_retries=0)
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/moderations", "body": {"model": MODEL, "input": f"text {i}"}}
             for i in range(3)]  # fmt: skip
    lines.append({"custom_id": "many", "method": "POST", "url": "/v1/moderations", "body": {"model": MODEL, "input": ["one", "two"]}})
    file = client.files.create(file=("in.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode()), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/moderations", completion_window="24h")
    done = wait_until(lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed") and b, what="the batch")
    assert done.status == "completed" and done.endpoint == "/v1/moderations", done
    assert done.request_counts.completed == 4 and done.request_counts.failed == 0 and done.error_file_id is None
    out = {}
    for line in client.files.content(done.output_file_id).text.splitlines():
        item = json.loads(line)
        assert item["error"] is None and item["response"]["status_code"] == 200
        out[item["custom_id"]] = item["response"]["body"]
    assert set(out) == {"c0", "c1", "c2", "many"}
    for cid, body in out.items():
        answer = ModerationCreateResponse.model_validate(body)
        assert set(body) == _names(ModerationCreateResponse) and answer.model == MODEL and answer.id.startswith("modr-")
        assert len(answer.results) == (2 if cid == "many" else 1)
        for verdict in body["results"]:
            _check_verdict(verdict)
    # The scores are a function of the custom_id: two lines get their own.
    assert out["c0"]["results"] != out["c1"]["results"]


def test_a_moderation_job_on_openai_batch_against_serve_succeeds_and_exports_each_verdict(serve, tmp_path):  # noqa: F811
    url = serve()
    store = Store(str(tmp_path / "client.db"))
    load_job(store, build_spec(_spec(tmp_path, "openai-batch", route_options=_options("openai-batch", url))), ManualClock())
    assert _run(store, "mod").counts == {"succeeded": 4}
    store.close()
    # `lowtide results`, as a user runs it: `output` is each row's verdict (results[0]) as JSON.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")} | {"LOWTIDE_DB": str(tmp_path / "client.db")}
    done = subprocess.run([LOWTIDE, "results", "mod", "--out", str(tmp_path / "out.jsonl")], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["post_id"] for r in rows] == ["p0", "p1", "p2", "p3"]
    for row in rows:
        assert row["state"] == "succeeded" and row["error"] is None and row["output_tokens"] == 0
        _check_verdict(json.loads(row["output"]))


def test_a_moderation_job_on_the_openai_direct_route_against_serve_succeeds(serve, tmp_path):  # noqa: F811
    url = serve()
    store = Store(str(tmp_path / "client.db"))
    options = {"base_url": f"{url}/v1", "api_key_env": KEY_ENV}
    load_job(store, build_spec(_spec(tmp_path, "openai", route_options=options)), ManualClock())
    assert _run(store, "mod").counts == {"succeeded": 4}
    # The SDK's own call, at its defaults (no model: the provider's default answers).
    answer = openai.OpenAI(base_url=f"{url}/v1", api_key="test-key", max_retries=0).moderations.create(input="hello")
    assert answer.model == MODEL and len(answer.results) == 1
    _check_verdict(answer.results[0].model_dump(by_alias=True))


@pytest.mark.parametrize("route", ["anthropic-batch", "anthropic", "gemini-batch", "local"])
def test_a_route_of_another_protocol_refuses_a_moderation_job_at_load_naming_route_and_endpoint(tmp_path, monkeypatch, route):
    monkeypatch.setenv(KEY_ENV, "test-key")
    store = Store(str(tmp_path / "client.db"))
    options = {} if route == "local" else {"api_key_env": KEY_ENV}
    with pytest.raises(LowtideError) as caught:
        load_job(store, build_spec(_spec(tmp_path, route, route_options=options)), ManualClock())
    said = str(caught.value)
    assert f"route {route} " in said and "/v1/moderations" in said, said
