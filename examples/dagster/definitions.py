"""Nightly ticket classification as a daily-partitioned Dagster asset (docs/dagster.md).

Each day's tickets land in examples/dagster/tickets/<day>.csv; the `classified_tickets`
partition for that day is one lowtide job, `classify-tickets-<day>`. As written it runs on
the `echo` route (no key, no model: it answers with the category the ticket names), so it
runs anywhere lowtide and `lowtide[dagster]` are installed:

    dagster asset materialize -f examples/dagster/definitions.py \\
        --select 'classified_tickets*' --partition 2026-12-01

For real work drop the `route` and `model` overrides (the spec's own), or set them to a batch
route (`openai-batch` and `gpt-4o-mini`, with OPENAI_API_KEY set where the run executes).
The store is LOWTIDE_DB, else ./lowtide.db where the run executes.
"""

from pathlib import Path

import pandas as pd
from dagster import AssetExecutionContext, DailyPartitionsDefinition, Definitions, asset

from lowtide.integrations.dagster import LowtideResource, lowtide_asset

EXAMPLES = Path(__file__).resolve().parent.parent
DAYS = DailyPartitionsDefinition(start_date="2026-12-01", end_date="2026-12-03")

classified_tickets = lowtide_asset(
    spec=EXAMPLES / "classify-tickets.yaml",
    name="classified_tickets",
    partitions_def=DAYS,
    overrides={
        "name": "classify-tickets-{partition}",
        "source": {"path": "dagster/tickets/{partition}.csv"},  # relative to the spec file
        "route": "echo",
        "model": "echo",
    },
    fail_on="any_failed",
    group_name="support",
)


@asset(partitions_def=DAYS, group_name="support")
def tickets_by_category(context: AssetExecutionContext, classified_tickets: pd.DataFrame) -> pd.DataFrame:
    """The day's tickets counted by the category lowtide gave them."""
    counts = classified_tickets.groupby("output").size().rename("tickets").reset_index()
    context.log.info(f"{context.partition_key}: {dict(zip(counts['output'], counts['tickets'], strict=True))}")
    return counts


defs = Definitions(
    assets=[classified_tickets, tickets_by_category],
    resources={"lowtide": LowtideResource()},  # LowtideResource(db="postgresql://…") for a shared store
)
