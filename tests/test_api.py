"""The Python API: a job from a DataFrame or a spec, run blocking or not, results as a frame."""

from __future__ import annotations

import pandas as pd

import lowtide
from tests.conftest import ticket_rows, write_csv


def test_a_dataframe_job_runs_and_joins_results_to_the_input_rows(tmp_path):
    df = pd.DataFrame(ticket_rows(25)).sample(frac=1, random_state=4)  # any order
    job = lowtide.Job.from_dataframe(
        df,
        name="frame",
        id_column="ticket_id",
        system="Pick a label.",
        user="{{ body }}",
        choices=["billing", "technical", "account", "shipping", "feedback"],
        model="any",
        route="echo",
        store=str(tmp_path / "lowtide.db"),
        source_dir=tmp_path / "sources",
    )
    status = job.run()
    assert status.all_succeeded and status.total == 25

    out = job.results()
    assert len(out) == 25
    merged = df.merge(out[["ticket_id", "output", "state"]], on="ticket_id")
    # echo picks the label the body mentions: the join is right row by row.
    assert (merged["output"] == merged["gold"]).all()
    assert set(merged["state"]) == {"succeeded"}


def test_start_does_not_block_and_wait_returns_the_final_status(tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(10))
    (tmp_path / "job.yaml").write_text(
        f"name: bg\nsource: {{path: {source}, id_column: ticket_id}}\n"
        "template: {user: '{{ body }}'}\nmodel: any\nroute: echo\n"
    )
    job = lowtide.Job.from_yaml(tmp_path / "job.yaml", store=str(tmp_path / "lowtide.db"))
    job.start()
    status = job.wait(timeout=60)
    assert job.done()
    assert status.counts == {"succeeded": 10}
    assert job.export(tmp_path / "out.parquet").exists()
