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


def _frame_job(tmp_path, df, **extra):
    return lowtide.Job.from_dataframe(
        df, name="nb", id_column="ticket_id", user="{{ body }} {{ note }}", model="any", route="echo",
        store=str(tmp_path / "lowtide.db"), source_dir=tmp_path / "sources", **extra,
    )  # fmt: skip


def test_run_inside_a_running_event_loop_drives_the_job_as_a_notebook_cell_would(tmp_path):
    import asyncio

    job = _frame_job(tmp_path, pd.DataFrame(ticket_rows(8)).assign(note="n"))

    async def cell():  # Jupyter runs every cell inside a live loop
        asyncio.get_running_loop()
        return job.run()

    status = asyncio.run(cell())
    assert status.all_succeeded and status.total == 8


def test_run_async_is_awaitable_on_the_callers_loop(tmp_path):
    import asyncio

    job = _frame_job(tmp_path, pd.DataFrame(ticket_rows(6)).assign(note="n"))
    status = asyncio.run(job.run_async(progress=False))
    assert status.counts == {"succeeded": 6}


def test_from_dataframe_takes_optional_columns_so_a_nan_cell_is_not_refused(tmp_path):
    df = pd.DataFrame(ticket_rows(5)).assign(note=["a", None, "c", float("nan"), "e"])
    try:
        _frame_job(tmp_path / "strict", df).submit()
    except lowtide.LowtideError as err:
        assert 'column "note" is empty' in str(err)
    else:
        raise AssertionError("an empty templated cell must be refused without optional_columns")
    status = _frame_job(tmp_path / "lenient", df, optional_columns=["note"]).run(progress=False)
    assert status.all_succeeded and status.total == 5


def _output_job(tmp_path, output: str, name: str = "out") -> lowtide.Job:
    source = write_csv(tmp_path / "t.csv", ticket_rows(6))
    (tmp_path / f"{name}.yaml").write_text(
        f"name: {name}\nsource: {{path: {source}, id_column: ticket_id}}\n"
        f"template: {{user: '{{{{ body }}}}'}}\nmodel: any\nroute: echo\noutput: {output}\n"
    )
    return lowtide.Job.from_yaml(tmp_path / f"{name}.yaml", store=str(tmp_path / "lowtide.db"))


def test_run_writes_the_specs_output_as_lowtide_run_does(tmp_path):
    import asyncio

    import pyarrow.parquet as pq
    import sqlalchemy as sa

    job = _output_job(tmp_path, "{path: results/tickets.parquet}")
    assert job.run(progress=False).all_succeeded
    assert (job.written.path, job.written.rows) == (tmp_path / "results" / "tickets.parquet", 6)
    assert pq.read_table(tmp_path / "results" / "tickets.parquet").column("state").to_pylist() == ["succeeded"] * 6

    url = f"sqlite:///{tmp_path / 'warehouse.db'}"  # a SQL table, through run_async
    job = _output_job(tmp_path, f"{{url: '{url}', table: answers}}", name="table")
    assert asyncio.run(job.run_async(progress=False)).all_succeeded
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM answers WHERE state = 'succeeded'")).scalar() == 6
    engine.dispose()


def test_run_refuses_a_bad_output_before_anything_is_stored(tmp_path):
    job = _output_job(tmp_path, "{path: ../elsewhere.csv}")
    try:
        job.run(progress=False)
    except lowtide.LowtideError as err:
        assert "output.path ../elsewhere.csv: a spec writes only inside its own folder" in str(err)
    else:
        raise AssertionError("a spec writing outside its folder ran")
    assert job.stored_spec() is None and not (tmp_path.parent / "elsewhere.csv").exists()
