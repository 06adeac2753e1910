"""Airflow's own `LLMBatchOperator` run through `lowtide serve` (docs/airflow-llm-batch.md).

The operator (apache-airflow-providers-common-ai[openai]) submits the prompts as one OpenAI
batch to the `lowtide` connection, whose host is `lowtide serve`'s `/v1`; serve runs the
batch as a lowtide job (retries of failed lines, cost in `lowtide report`) and the operator
lands one JSONL row per prompt under `LLM_BATCH_RESULTS` (default file:///tmp/llm-batch).

    lowtide serve --backend echo --port 8000      # or --backend openai-batch, ...
    export AIRFLOW_CONN_LOWTIDE='{"conn_type": "pydanticai", "host": "http://127.0.0.1:8000/v1", "password": "any"}'
    airflow dags test triage_tickets_batch 2026-12-01
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Literal

from airflow.providers.common.ai.operators.llm_batch import LLMBatchOperator
from airflow.sdk import DAG, ObjectStoragePath, task
from pydantic import BaseModel

RESULTS = os.environ.get("LLM_BATCH_RESULTS", "file:///tmp/llm-batch")

TICKETS = [
    "I was charged twice for my March invoice, please refund one of them.",
    "The tracking number you emailed me says invalid on the carrier's site.",
    "Please move the admin rights from our former office manager to me.",
    "The export button crashes the app every time since the last update.",
    "Do you ship to Iceland?",
]


class Triage(BaseModel):
    """The answer asked of every ticket (sent as `response_format: json_schema`)."""

    category: Literal["billing", "shipping", "account", "bug", "other"]
    urgent: bool


@task
def count_categories(manifest: dict) -> dict[str, int]:
    """Read the landed rows back: the XCom value is the manifest, the rows are on storage."""
    counts: dict[str, int] = {}
    for line in ObjectStoragePath(manifest["result_uri"]).read_text().splitlines():
        row = json.loads(line)
        key = row["output"]["category"] if row["status"] == "success" else row["status"]
        counts[key] = counts.get(key, 0) + 1
    print("triage counts:", json.dumps(counts, sort_keys=True))
    return counts


with DAG(
    "triage_tickets_batch", schedule=None, start_date=datetime(2026, 12, 1), catchup=False
) as dag:
    triage = LLMBatchOperator(
        task_id="triage",
        requests=[f"Ticket: {ticket}" for ticket in TICKETS],
        # One folder per run, the same on every attempt: a retry finds its recorded batch
        # there and re-attaches to it instead of paying for a second one.
        result_path=RESULTS + "/{{ dag.dag_id }}/{{ run_id }}",
        llm_conn_id="lowtide",
        model_id="openai:gpt-4o-mini",
        system_prompt="Triage the support ticket: its category, and whether it is urgent.",
        output_type=Triage,
        max_tokens=64,
        poll_interval=30,  # the operator's minimum
        deferrable=True,  # the wait runs in the triggerer and holds no worker slot
        retries=2,
    )
    count_categories(triage.output)
