"""lowtide inside Dagster, with the real `dagster` package: assets materialised in-process
(`dagster.materialize`) against a real SQLite store, on the echo routes and on openai-batch
against `lowtide serve`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

dg = pytest.importorskip("dagster")

from lowtide.core.clock import SystemClock  # noqa: E402
from lowtide.core.errors import InputError  # noqa: E402
from lowtide.core.spec import build_spec  # noqa: E402
from lowtide.engine.loader import load_job  # noqa: E402
from lowtide.engine.tick import Engine  # noqa: E402
from lowtide.integrations.dagster import LowtideResource, lowtide_asset  # noqa: E402
from lowtide.store.db import Store  # noqa: E402
from lowtide.store.schema import dispatches, jobs, requests  # noqa: E402
from tests.conftest import ticket_rows, write_csv  # noqa: E402
from tests.routes.conftest import _options, serve  # noqa: E402, F401 (`lowtide serve` as a fixture)

ROOT = Path(__file__).resolve().parents[2]
LOWTIDE = str(Path(sys.executable).with_name("lowtide"))
DAYS = ("2026-12-01", "2026-12-02")
LABELS = ["billing", "technical", "account", "shipping", "feedback"]


def spec_dict(tmp_path: Path, **more) -> dict:
    """A spec over the day's tickets file; `{partition}` is filled in by the asset."""
    data = {
        "name": "tickets",
        "source": {"path": str(tmp_path / "tickets" / "all.csv"), "id_column": "ticket_id"},
        "template": {"system": "Classify the ticket.", "user": "Ticket: {{ body }}"},
        "model": "test-model",
        "route": "echo",
        "choices": LABELS,
        "params": {"max_tokens": 16},
        "retry": {"max_attempts": 2, "backoff_seconds": 1},
    }
    return data | more


def day_files(tmp_path: Path) -> dict[str, list[dict]]:
    (tmp_path / "tickets").mkdir(exist_ok=True)
    rows = {DAYS[0]: ticket_rows(3, start=1000), DAYS[1]: ticket_rows(4, start=2000)}
    for day, day_rows in rows.items():
        write_csv(tmp_path / "tickets" / f"{day}.csv", day_rows)
    return rows


def daily_asset(spec, **kwargs):
    """A daily asset over the spec; its source is the day's file: `{partition}` is the day."""
    overrides = {"source": {"path": str(Path(spec["source"]["path"]).with_name("{partition}.csv"))}}
    return lowtide_asset(
        spec=spec, name=kwargs.pop("name", "tagged_tickets"), partitions_def=dg.DailyPartitionsDefinition(start_date=DAYS[0]),
        overrides=overrides, log_interval=0.5, **kwargs,
    )  # fmt: skip


def materialise(asset, db: Path, day: str, **kwargs):
    return dg.materialize([asset], partition_key=day, resources={"lowtide": LowtideResource(db=str(db))}, **kwargs)


def metadata_of(result, name: str = "tagged_tickets") -> dict:
    (event,) = result.asset_materializations_for_node(name)
    return {key: value.value for key, value in event.metadata.items()}


def failure_of(result) -> str:
    (event,) = [e for e in result.all_events if e.is_step_failure]
    return event.step_failure_data.user_failure_data.description


def stored(db: Path, table, *where) -> list:
    store = Store(str(db), create=False)
    try:
        with store.begin() as conn:
            return conn.execute(sa.select(table).where(*where)).all()
    finally:
        store.close()


def job_rows(db: Path, name: str) -> list:
    (job,) = stored(db, jobs, jobs.c.name == name)
    return stored(db, requests, requests.c.job_id == job.id)


def test_a_daily_asset_materialises_each_partition_as_its_own_job_with_that_days_rows(tmp_path):
    rows = day_files(tmp_path)
    asset = daily_asset(spec_dict(tmp_path))
    db = tmp_path / "lowtide.db"
    for day in DAYS:
        result = materialise(asset, db, day)
        assert result.success
        frame = result.output_for_node("tagged_tickets")
        assert sorted(frame["ticket_id"].astype(str)) == sorted(r["ticket_id"] for r in rows[day])
        # echo picks the label the ticket names: each answer is paired with its own row
        assert (frame["output"] == frame["gold"]).all() and set(frame["state"]) == {"succeeded"}
        meta = metadata_of(result)
        assert meta["job"] == f"tickets-{day}" and meta["state"] == "finished"
        assert (meta["requests"], meta["succeeded"], meta["failed"], meta["failures"]) == (len(rows[day]), len(rows[day]), 0, 0)
        assert meta["dagster/row_count"] == len(rows[day])
    assert sorted(j.name for j in stored(db, jobs)) == [f"tickets-{day}" for day in DAYS]
    assert {r.custom_id for r in job_rows(db, "tickets-2026-12-02")} == {r["ticket_id"] for r in rows[DAYS[1]]}


def test_metadata_equals_what_lowtide_report_and_status_say_and_results_go_to_results_path(tmp_path, serve):  # noqa: F811
    """A priced batch route (openai-batch against `lowtide serve`): cost, real-time cost and
    savings in the metadata are `lowtide report --json`'s figures for the job."""
    url = serve()
    day_files(tmp_path)
    spec = spec_dict(tmp_path, model="gpt-4o-mini", route="openai-batch", route_options=_options("openai-batch", url))
    asset = daily_asset(spec, results_path="out/{partition}.parquet")
    db = tmp_path / "lowtide.db"
    result = dg.materialize(
        [asset], partition_key=DAYS[1], resources={"lowtide": LowtideResource(db=str(db), results_dir=str(tmp_path / "results"))}
    )
    assert result.success
    meta = metadata_of(result)
    job = f"tickets-{DAYS[1]}"
    env = {**os.environ, "LOWTIDE_DB": str(db)}
    report = json.loads(subprocess.run([LOWTIDE, "report", "--job", job, "--json"], env=env, capture_output=True, text=True, check=True).stdout)
    total = report["total"]
    assert float(total["cost_usd"]) > 0 and float(total["saving_usd"]) > 0
    assert (meta["cost_usd"], meta["realtime_usd"], meta["savings_usd"]) == tuple(
        float(total[k]) for k in ("cost_usd", "realtime_usd", "saving_usd")
    )
    status = json.loads(subprocess.run([LOWTIDE, "status", job, "--json"], env=env, capture_output=True, text=True, check=True).stdout)
    assert meta["counts"] == {state: n for state, n in status["requests"].items() if n} == {"succeeded": 4}
    assert (meta["job"], meta["state"], meta["requests"], meta["failures"]) == (job, status["state"], status["total"], 0)
    path = Path(meta["results_path"])
    assert path == tmp_path / "results" / "out" / f"{DAYS[1]}.parquet" and path.exists()
    import pandas as pd

    assert len(pd.read_parquet(path)) == 4
    assert not isinstance(result.output_for_node("tagged_tickets"), pd.DataFrame)  # the file is the asset: no IO manager value

    # A budget too small for one batch: nothing is sent, and the materialisation says why.
    poor = daily_asset(spec | {"budget_usd": "0.0000001"}, results_path="out/{partition}.parquet")
    result = materialise(poor, db, DAYS[0], raise_on_error=False)
    assert "its budget_usd is spent with 3 request(s) not sent" in failure_of(result)
    assert "raise budget_usd in the spec and materialise again" in failure_of(result)


def test_materialising_a_partition_again_resumes_its_job_and_sends_no_second_batch(tmp_path):
    """A run that died after submitting (the batch is at the provider, not back yet): the
    retried materialisation adopts the job by name and collects that batch; a third finds
    the job finished and sends nothing."""
    rows = day_files(tmp_path)
    provider = tmp_path / "echo-batch"
    spec = spec_dict(tmp_path, route="echo-batch", route_options={"dir": str(provider), "polls_to_complete": 2})
    asset = daily_asset(spec)
    db = tmp_path / "lowtide.db"
    day = DAYS[0]
    job = f"tickets-{day}"

    # The first run: rows stored, one tick sends the batch, then the worker is gone.
    store = Store(str(db))
    try:
        data = spec | {"name": job, "source": {**spec["source"], "path": str(tmp_path / "tickets" / f"{day}.csv")}}
        load_job(store, build_spec(data), SystemClock())

        async def one_tick():
            async with Engine(store) as engine:
                await engine.tick(job)

        asyncio.run(one_tick())
    finally:
        store.close()
    sent = stored(db, dispatches)
    assert len(sent) == 1 and sent[0].provider_id
    assert len(list(provider.iterdir())) == 1

    for _ in range(2):  # the retry, then a materialisation of a finished partition
        result = materialise(asset, db, day)
        assert result.success
        assert sorted(result.output_for_node("tagged_tickets")["ticket_id"].astype(str)) == [r["ticket_id"] for r in rows[day]]
        assert [d.provider_id for d in stored(db, dispatches)] == [sent[0].provider_id]  # the same one batch
        assert len(list(provider.iterdir())) == 1
        assert metadata_of(result)["succeeded"] == len(rows[day])


@pytest.mark.parametrize(
    ("fail_on", "rejected", "fails"),
    [
        ("any_failed", ["T1000"], True),
        ("all_failed", ["T1000"], False),
        ("all_failed", ["T1000", "T1001", "T1002"], True),
        ("never", ["T1000", "T1001", "T1002"], False),
    ],
)
def test_fail_on_decides_whether_failed_requests_fail_the_materialisation(tmp_path, fail_on, rejected, fails):
    day_files(tmp_path)
    asset = daily_asset(spec_dict(tmp_path, route_options={"reject": rejected}), fail_on=fail_on)
    result = materialise(asset, tmp_path / "lowtide.db", DAYS[0], raise_on_error=False)
    assert result.success is not fails
    if fails:
        message = failure_of(result)
        assert message.startswith("lowtide: job 'tickets-2026-12-01': ")
        assert ("no request succeeded" if fail_on == "all_failed" else f"{len(rejected)} request(s) failed") in message
    else:
        meta = metadata_of(result)
        assert meta["failed"] == meta["failures"] == len(rejected)
        assert meta["top_failure_reasons"] == {"invalid_request": len(rejected)}


def test_fail_on_is_checked_when_the_asset_is_defined(tmp_path):
    with pytest.raises(ValueError, match="fail_on='some'; give one of any_failed, all_failed, never"):
        lowtide_asset(spec=spec_dict(tmp_path), name="a", fail_on="some")
    with pytest.raises(ValueError, match=r"\{partition\} is used but the asset has no partitions_def"):
        lowtide_asset(spec=spec_dict(tmp_path), name="a", overrides={"source": {"path": "{partition}.csv"}})


def test_a_spec_that_does_not_load_fails_at_once_with_lowtides_message_and_stores_nothing(tmp_path):
    day_files(tmp_path)
    db = tmp_path / "lowtide.db"
    bad = spec_dict(tmp_path, temprature=0)
    result = materialise(daily_asset(bad), db, DAYS[0], raise_on_error=False)
    assert not result.success
    message = failure_of(result)
    assert message.startswith("lowtide: job spec") and "temprature" in message
    assert stored(db, jobs) == []

    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: tickets\nsource: {path: x.csv, id_column: ticket_id}\ntemplate: {user: '{{ body }}'}\nmodel: m\nroute: echo\nretries: 3\n")
    result = materialise(lowtide_asset(spec=spec_file, name="tagged_tickets"), db, None, raise_on_error=False)
    assert failure_of(result).startswith(f"lowtide: {spec_file}: invalid job spec")
    assert f"{spec_file} line 6: unknown key `retries`; known keys here: name, source" in failure_of(result)
    assert stored(db, jobs) == []
    # a partition's job (its name and source overridden) still names the file's line
    partitioned = lowtide_asset(
        spec=spec_file, name="tagged_tickets", partitions_def=dg.DailyPartitionsDefinition(start_date=DAYS[0]),
        overrides={"source": {"path": "{partition}.csv"}},
    )  # fmt: skip
    result = materialise(partitioned, db, DAYS[0], raise_on_error=False)
    assert f"{spec_file} line 6: unknown key `retries`" in failure_of(result)
    assert stored(db, jobs) == []

    spec_file.write_text("name: tickets\nsource: {path: x.csv, id_column: ticket_id}\ntemplate: {user: '{{ body }}'}\nmodel: m\nroute: nowhere\n")
    result = materialise(lowtide_asset(spec=spec_file, name="tagged_tickets"), db, None, raise_on_error=False)
    assert 'unknown route "nowhere"' in failure_of(result) and "Fix the `route:` key of the job spec" in failure_of(result)
    assert stored(db, jobs) == []

    # A row the template cannot render: refused before a request is stored.
    write_csv(tmp_path / "tickets" / f"{DAYS[1]}.csv", [{"ticket_id": "T1", "body": ""}])
    result = materialise(daily_asset(spec_dict(tmp_path)), db, DAYS[1], raise_on_error=False)
    assert "row" in failure_of(result) and '"body"' in failure_of(result)
    assert stored(db, requests) == []


def test_a_job_name_stored_from_another_spec_is_refused_and_the_stored_job_is_kept(tmp_path):
    day_files(tmp_path)
    db = tmp_path / "lowtide.db"
    first = materialise(daily_asset(spec_dict(tmp_path)), db, DAYS[0])
    before, sent = [tuple(r) for r in job_rows(db, "tickets-2026-12-01")], stored(db, dispatches)

    other = spec_dict(tmp_path, template={"user": "Another question: {{ body }}"})
    result = materialise(daily_asset(other, name="other_tickets"), db, DAYS[0], raise_on_error=False)
    assert not result.success
    message = failure_of(result)
    assert 'job "tickets-2026-12-01" was stored with' in message and "Use a new job name" in message
    assert [tuple(r) for r in job_rows(db, "tickets-2026-12-01")] == before
    assert stored(db, dispatches) == sent  # nothing new was sent

    # The same spec over another day's file, under the same job name: its rows would join
    # that job (the loader takes a moved source), so the asset refuses it.
    clash = lowtide_asset(
        spec=spec_dict(tmp_path), name="other_tickets", partitions_def=dg.DailyPartitionsDefinition(start_date=DAYS[0]),
        overrides={"name": "tickets-2026-12-01", "source": {"path": str(tmp_path / "tickets" / f"{DAYS[1]}.csv")}},
    )  # fmt: skip
    result = materialise(clash, db, DAYS[0], raise_on_error=False)
    message = failure_of(result)
    assert f'lowtide: job "tickets-2026-12-01" is stored over source {tmp_path / "tickets" / f"{DAYS[0]}.csv"}' in message
    assert "give this asset its own" in message
    assert [tuple(r) for r in job_rows(db, "tickets-2026-12-01")] == before
    assert stored(db, dispatches) == sent
    assert metadata_of(first)["succeeded"] == 3


def test_without_the_extra_or_with_an_unsupported_dagster_the_import_names_the_fix():
    def run(code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)

    missing = run("import sys; sys.modules['dagster'] = None\nimport lowtide.integrations.dagster")
    assert missing.returncode != 0
    assert "lowtide.integrations.dagster needs the 'dagster' extra: pip install 'lowtide[dagster]'" in missing.stderr

    old = run("import dagster; dagster.__version__ = '1.5.2'\nimport lowtide.integrations.dagster")
    assert "supports dagster 1.8 to below 2; 1.5.2 is installed: pip install 'lowtide[dagster]'" in old.stderr

    core = run("import sys, lowtide, lowtide.api, lowtide.integrations; assert 'dagster' not in sys.modules, 'core imports dagster'")
    assert core.returncode == 0, core.stderr


def test_a_missing_extra_is_an_input_error_and_an_import_error():
    from lowtide.integrations import MissingExtra

    assert issubclass(MissingExtra, InputError) and issubclass(MissingExtra, ImportError)


def test_the_documented_definitions_file_runs_as_written(tmp_path):
    """docs/dagster.md shows examples/dagster/definitions.py whole; Dagster's own CLI
    materialises a day of it (and its downstream asset) against a fresh store, twice."""
    example = ROOT / "examples" / "dagster" / "definitions.py"
    doc = (ROOT / "docs" / "dagster.md").read_text()
    assert "```python\n" + example.read_text() + "```" in doc
    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "LOWTIDE_DB": str(tmp_path / "lowtide.db")}
    command = [str(Path(sys.executable).with_name("dagster")), "asset", "materialize", "-f", str(example),
               "--select", "classified_tickets*", "--partition", DAYS[0]]  # fmt: skip
    for _ in range(2):  # the second finds the job finished: same job, same requests, nothing sent
        ran = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert "RUN_SUCCESS" in ran.stderr and "tickets_by_category" in ran.stderr
        db = tmp_path / "lowtide.db"
        assert [j.name for j in stored(db, jobs)] == ["classify-tickets-2026-12-01"]
        assert sorted(r.state for r in job_rows(db, "classify-tickets-2026-12-01")) == ["succeeded"] * 6
        assert len(stored(db, dispatches)) == 1  # one dispatch of the six requests, made once
