"""A daily Airflow DAG that classifies the day's tickets with lowtide (docs/airflow.md).

As written it runs on the `echo` route (no key, no model: it answers with the category the
ticket names), so it runs anywhere lowtide and `lowtide[airflow]` are installed:

    airflow dags test classify_tickets 2026-12-01

For real work change `route` and `model` (say `openai-batch` and `gpt-4o-mini` with
OPENAI_API_KEY set): the task then defers while the provider's batch runs and holds no
worker slot. The store is LOWTIDE_DB (or ./lowtide.db where the task runs); the results land
in examples/results/.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG

from lowtide.integrations.airflow import LowtideJobOperator

EXAMPLES = Path(__file__).resolve().parent.parent
RESULTS = Path(os.environ.get("LOWTIDE_RESULTS", EXAMPLES / "results"))

with DAG("classify_tickets", schedule="@daily", start_date=datetime(2026, 12, 1), catchup=False) as dag:
    LowtideJobOperator(
        task_id="classify",
        spec=EXAMPLES / "classify-tickets.yaml",
        overrides={"name": "classify-tickets-{{ ds }}", "route": "echo", "model": "echo"},
        results_path=str(RESULTS / "classify-tickets-{{ ds }}.csv"),
        fail_on="any_failed",
        poll_interval=1,
    )
