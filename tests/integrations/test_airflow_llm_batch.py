"""Airflow's own `LLMBatchOperator` (apache-airflow-providers-common-ai) pointed at `lowtide
serve` (issue 29): the recipe's DAG file, examples/airflow_llm_batch_dag.py
(docs/airflow-llm-batch.md), run as written with `dag.test()` on a SQLite metadata DB, in
subprocesses of their own so Airflow's settings never enter this one (nor does `airflow`:
the skip reads the installed distributions' metadata).

One line fails once at the backend: serve retries it inside the batch, and the operator sees
one clean batch. A second run of the same DAG run re-attaches to the recorded batch instead
of paying for another."""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_provider = pytest.mark.skipif(
    not _installed("apache-airflow-providers-common-ai"),
    reason="an optional recipe: airflow.providers.common.ai is not installed "
    "(pip install 'apache-airflow-providers-common-ai[openai]')",
)

from tests.routes.conftest import serve  # noqa: E402, F401 (the fixture)

ROOT = Path(__file__).resolve().parents[2]
DAG_FILE = ROOT / "examples" / "airflow_llm_batch_dag.py"
DOC = ROOT / "docs" / "airflow-llm-batch.md"
DAG_ID, TASK_ID = "triage_tickets_batch", "triage"
RUN_AT = "2026-12-01T00:00:00+00:00"  # logical date and run_after: the run id is fixed
RUN_ID = f"manual__{RUN_AT}"
CATEGORIES = {"billing", "shipping", "account", "bug", "other"}
RUN_DAG = f"""
import runpy, sys
from datetime import datetime
at = datetime.fromisoformat({RUN_AT!r})
dag = runpy.run_path(sys.argv[1])["dag"]
run = dag.test(logical_date=at, run_after=at)
print("DAG RUN", run.run_id, run.state)
"""


def _tickets() -> list[str]:
    """TICKETS as the DAG file writes them (read, not imported: no airflow in this process)."""
    for node in ast.parse(DAG_FILE.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "TICKETS" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"no TICKETS in {DAG_FILE}")


def _prefix() -> str:
    """The operator's custom_id prefix for this task instance (its state.compute_identity_key, key16)."""
    identity = "\x00".join([DAG_ID, TASK_ID, RUN_ID, "-1"])
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def _airflow(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_the_recipe_shows_the_dag_file_the_test_runs():
    text = DOC.read_text()
    shown = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert shown == DAG_FILE.read_text()


@needs_provider
def test_llm_batch_operator_runs_its_batch_on_lowtide_serve(serve, tmp_path):  # noqa: F811
    prefix = _prefix()
    # echo fails the third request's first attempt with a retryable server_error.
    url = serve("-o", "fail_attempts=" + json.dumps({f"{prefix}-2": 1}))
    dags, home, results = tmp_path / "dags", tmp_path / "airflow", tmp_path / "results"
    dags.mkdir()
    home.mkdir()
    shutil.copy(DAG_FILE, dags / DAG_FILE.name)  # the recipe's file, as written
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")} | {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW_CONN_LOWTIDE": json.dumps(
            {"conn_type": "pydanticai", "host": f"{url}/v1", "password": "test-key"}
        ),
        "LLM_BATCH_RESULTS": results.as_uri(),
    }
    migrated = _airflow(["-m", "airflow", "db", "migrate"], env)
    assert migrated.returncode == 0, migrated.stdout[-2000:] + migrated.stderr[-2000:]
    script = tmp_path / "run_dag.py"
    script.write_text(RUN_DAG)

    done = _airflow([str(script), str(dags / DAG_FILE.name)], env)
    said = done.stdout + done.stderr
    assert f"DAG RUN {RUN_ID} success" in done.stdout, said[-6000:]

    # Every prompt answered, landed where the recipe says, one row per prompt.
    tickets = _tickets()
    run_dir = results / DAG_ID / RUN_ID
    rows = [json.loads(line) for line in (run_dir / f"{prefix}.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(len(tickets)))
    assert all(r["status"] == "success" and r["error"] is None for r in rows), rows
    assert all(
        r["output"]["category"] in CATEGORIES and isinstance(r["output"]["urgent"], bool)
        for r in rows
    )
    assert all(r["model"] == "gpt-4o-mini" and r["finish_reason"] == "stop" for r in rows)
    counted = json.loads(
        said.split("triage counts: ", 1)[1].splitlines()[0]
    )  # the downstream task read them
    assert sum(counted.values()) == len(tickets) and set(counted) <= CATEGORIES

    # serve saw exactly one batch, completed, every request answered (the failed attempt retried).
    auth = {"Authorization": "Bearer test-key"}
    listed = httpx.get(f"{url}/v1/batches", headers=auth).json()["data"]
    assert len(listed) == 1, listed
    batch = listed[0]
    assert batch["status"] == "completed" and batch["endpoint"] == "/v1/chat/completions"
    assert batch["request_counts"] == {
        "total": len(tickets),
        "completed": len(tickets),
        "failed": 0,
    }
    assert batch["error_file_id"] is None
    assert batch["metadata"]["idempotency_key"] == prefix
    state = json.loads(next((run_dir / "_airflow_batch_state").glob("*.json")).read_text())
    assert (
        state["batch_id"] == batch["id"] and state["provider_input_ref"] == batch["input_file_id"]
    )

    # What the operator sent, as serve stored it, and what it landed: serve's answers verbatim.
    sent = [
        json.loads(line)
        for line in httpx.get(
            f"{url}/v1/files/{batch['input_file_id']}/content", headers=auth
        ).text.splitlines()
    ]
    assert [line["custom_id"] for line in sent] == [f"{prefix}-{i}" for i in range(len(tickets))]
    for line, ticket in zip(sent, tickets, strict=True):
        body = line["body"]
        assert body["model"] == "gpt-4o-mini" and body["max_completion_tokens"] == 64
        assert body["messages"][-1] == {"role": "user", "content": f"Ticket: {ticket}"}
        assert (
            body["response_format"]["type"] == "json_schema"
            and body["response_format"]["json_schema"]["name"] == "Triage"
        )
    answered = {}
    for line in httpx.get(
        f"{url}/v1/files/{batch['output_file_id']}/content", headers=auth
    ).text.splitlines():
        out = json.loads(line)
        assert out["response"]["status_code"] == 200
        answered[out["custom_id"]] = json.loads(
            out["response"]["body"]["choices"][0]["message"]["content"]
        )
    assert {r["custom_id"]: r["output"] for r in rows} == answered

    # In lowtide's store the batch is a job: 6 attempts for 5 requests, the one failure retried.
    report = subprocess.run([str(Path(sys.executable).with_name("lowtide")), "--db", str(tmp_path / "server.db"),
                             "report", "--job", batch["id"], "--json"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert report.returncode == 0, report.stderr
    total = json.loads(report.stdout)["total"]
    assert (total["attempts"], total["failures"]) == (len(tickets) + 1, 1)

    # The same DAG run again (a clear, a retry): the operator re-attaches to the recorded batch
    # and lands the same rows; serve still holds one batch.
    again = _airflow([str(script), str(dags / DAG_FILE.name)], env)
    assert f"DAG RUN {RUN_ID} success" in again.stdout, (again.stdout + again.stderr)[-6000:]
    assert "Re-attaching to batch " + batch["id"] in again.stdout + again.stderr
    assert len(httpx.get(f"{url}/v1/batches", headers=auth).json()["data"]) == 1
    relanded = [json.loads(line) for line in (run_dir / f"{prefix}.jsonl").read_text().splitlines()]
    assert relanded == rows
