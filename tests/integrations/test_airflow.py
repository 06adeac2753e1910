"""lowtide inside Airflow (issue 29): the real `apache-airflow` package, DAG runs in-process
(`dag.test()`) on a SQLite metadata DB, each in a subprocess of its own so Airflow's global
settings stay out of this one; a triggerer killed mid-job and replaced makes no second
provider batch."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

pytest.importorskip("airflow", reason="the airflow extra is not installed")

from lowtide.store.db import Store  # noqa: E402
from lowtide.store.schema import dispatches, jobs, requests  # noqa: E402
from tests.conftest import wait_until  # noqa: E402
from tests.routes.conftest import KEY_ENV, serve  # noqa: E402, F401 (the fixture)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "airflow" / "classify_tickets_dag.py"
RUN_DAG = """
import runpy, sys
from datetime import datetime, timezone
dag = runpy.run_path(sys.argv[1])["dag"]
run = dag.test(logical_date=datetime(2026, 12, 1, tzinfo=timezone.utc))
print("DAG RUN", run.state)
"""


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory) -> Path:
    """An Airflow home with a migrated SQLite metadata DB, shared by this module's runs."""
    home = tmp_path_factory.mktemp("airflow")
    done = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=_env(home, home / "dags"),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return home


def _env(home: Path, dags: Path, **more: str) -> dict[str, str]:
    return os.environ | {
        "AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
    } | more  # fmt: skip


def run_dag(home: Path, dag_file: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "run_dag.py"
    script.write_text(RUN_DAG)
    return subprocess.run([sys.executable, str(script), str(dag_file)], env=_env(home, dag_file.parent, **env),
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_the_documented_dag_runs_as_written(airflow_home, tmp_path):
    store, results = tmp_path / "lowtide.db", tmp_path / "results"
    done = run_dag(airflow_home, EXAMPLE, tmp_path, LOWTIDE_DB=str(store), LOWTIDE_RESULTS=str(results))
    assert "DAG RUN success" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    with Store(str(store)).begin() as conn:
        counts = dict(conn.execute(sa.select(requests.c.state, sa.func.count()).group_by(requests.c.state)).all())
        names = conn.scalars(sa.select(jobs.c.name)).all()
    assert names == ["classify-tickets-2026-12-01"]  # the templated override, rendered by Airflow
    assert counts == {"succeeded": 300}
    with (results / "classify-tickets-2026-12-01.csv").open(newline="") as f:
        assert len(list(csv.DictReader(f))) == 300


def _dag_file(folder: Path, spec: dict, **operator) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "lowtide_dag.py"
    path.write_text(textwrap.dedent(f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from lowtide.integrations.airflow import LowtideJobOperator

        with DAG("lowtide_test", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
            LowtideJobOperator(task_id="job", spec={spec!r}, poll_interval=0.1, retries=2, **{operator!r})
    """))
    return path


def _spec(tmp_path: Path, **more) -> dict:
    source = tmp_path / "rows.csv"
    source.write_text("id,text\n1,billing question\n2,shipping question\n3,account question\n")
    return {"name": "airflow-job", "source": {"path": str(source), "id_column": "id"}, "template": {"user": "{{ text }}"},
            "model": "echo", "route": "echo", **more}  # fmt: skip


def test_fail_on_decides_the_tasks_fate(airflow_home, tmp_path):
    store = tmp_path / "lowtide.db"
    rejecting = _spec(tmp_path, route_options={"reject": ["1"]})
    failed = run_dag(airflow_home, _dag_file(tmp_path / "a", rejecting), tmp_path, LOWTIDE_DB=str(store))
    assert "DAG RUN failed" in failed.stdout, failed.stdout[-3000:]
    assert "1 request(s) failed or were cancelled" in failed.stdout + failed.stderr
    tolerant = run_dag(airflow_home, _dag_file(tmp_path / "b", rejecting | {"name": "airflow-job-2"}, fail_on="all_failed"),
                       tmp_path, LOWTIDE_DB=str(store))  # fmt: skip
    assert "DAG RUN success" in tolerant.stdout, tolerant.stdout[-3000:]


def test_a_spec_that_does_not_load_fails_at_once_with_lowtides_message(airflow_home, tmp_path):
    store = tmp_path / "lowtide.db"
    broken = _spec(tmp_path)
    del broken["source"]
    done = run_dag(airflow_home, _dag_file(tmp_path / "dags", broken), tmp_path, LOWTIDE_DB=str(store))
    said = done.stdout + done.stderr
    assert "DAG RUN failed" in done.stdout
    assert "`source` is required" in said and "AirflowFailException" in said
    assert said.count("[DAG TEST] running task") == 1  # not retried (retries=2): a retry cannot fix a spec
    with Store(str(store)).begin() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(jobs)) == 0  # nothing stored


TRIGGER = """
import asyncio, json, sys
from lowtide.integrations.airflow import LowtideJobTrigger
path, kwargs = LowtideJobTrigger(**json.loads(sys.argv[1])).serialize()  # as the triggerer stores it
assert path == "lowtide.integrations.airflow.LowtideJobTrigger"

async def main():
    async for event in LowtideJobTrigger(**kwargs).run():
        print("EVENT", json.dumps(event.payload), flush=True)

asyncio.run(main())
"""


def test_a_triggerer_killed_mid_job_is_replaced_without_a_second_batch(serve, tmp_path):  # noqa: F811
    url = serve("--complete-after", "20", "--time-scale", "10")  # a batch takes ~2 s: in flight when killed
    store_path = tmp_path / "lowtide.db"
    spec = _spec(tmp_path, route="openai-batch", model="gpt-4o-mini", params={"max_tokens": 16},
                 route_options={"base_url": f"{url}/v1", "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2]})  # fmt: skip
    from lowtide.api import Job

    store = Store(str(store_path))
    Job.from_spec(spec, store).submit()  # what the operator's execute does before deferring
    kwargs = json.dumps({"job": "airflow-job", "db": str(store_path), "poll_interval": 0.1})
    script = tmp_path / "trigger.py"
    script.write_text(TRIGGER)
    first = subprocess.Popen([sys.executable, str(script), kwargs], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def submitted() -> bool:
        with store.begin() as conn:
            return conn.scalar(sa.select(sa.func.count()).where(dispatches.c.provider_id.is_not(None))) > 0

    wait_until(submitted, timeout=60, what="the first triggerer to submit the batch")
    first.send_signal(signal.SIGKILL)  # the triggerer dies with the batch in flight
    first.wait()
    second = subprocess.run([sys.executable, str(script), kwargs], capture_output=True, text=True, timeout=300)
    assert 'EVENT {"status": "done", "job": "airflow-job"}' in second.stdout, second.stderr[-3000:]
    with store.begin() as conn:
        states = dict(conn.execute(sa.select(requests.c.state, sa.func.count()).group_by(requests.c.state)).all())
        sent = conn.scalar(sa.select(sa.func.count()).where(dispatches.c.provider_id.is_not(None)))
    assert states == {"succeeded": 3}
    assert sent == 1
    listed = httpx.get(f"{url}/v1/batches", headers={"Authorization": "Bearer test-key"}).json()["data"]
    assert len(listed) == 1  # the provider saw one batch, not two


def test_a_missing_or_unsupported_airflow_is_named_with_the_fix():
    hidden = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['airflow'] = None; import lowtide.integrations.airflow"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert hidden.returncode != 0 and "pip install 'lowtide[airflow]'" in hidden.stderr
    from lowtide.integrations import MissingExtra, require

    with pytest.raises(MissingExtra, match=r"supports airflow 99 or later; .* is installed: pip install 'lowtide\[airflow\]'"):
        require("airflow", "airflow", minimum=(99,))


def test_a_job_name_stored_from_another_spec_fails_at_once(airflow_home, tmp_path):
    store = tmp_path / "lowtide.db"
    first = run_dag(airflow_home, _dag_file(tmp_path / "a", _spec(tmp_path)), tmp_path, LOWTIDE_DB=str(store))
    assert "DAG RUN success" in first.stdout, first.stdout[-3000:]
    other = _spec(tmp_path) | {"template": {"user": "Classify: {{ text }}"}}  # same name, other requests
    second = run_dag(airflow_home, _dag_file(tmp_path / "b", other), tmp_path, LOWTIDE_DB=str(store))
    said = second.stdout + second.stderr
    assert "DAG RUN failed" in second.stdout and "AirflowFailException" in said
    assert "airflow-job" in said and "requeue" in said  # lowtide's message: what changed and the fix
    with Store(str(store)).begin() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(dispatches)) == 1  # nothing more was sent
