"""A worker whose PostgreSQL connection the server ends (a failover, an administrator, an idle
timeout): it exits with lowtide's own message and exit code 3, not a traceback or an
"unexpected error", and nothing it was doing is applied twice."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import pytest
import sqlalchemy as sa
import yaml

from tests.conftest import PG_ADMIN_URL, fresh_pg_schema
from tests.reliability.test_kill import _harness


@pytest.fixture
def own_schema(pg_schema_url):
    """A schema of this test's own: the run's shared one holds other tests' jobs."""
    with fresh_pg_schema("lowtide_cut") as url:
        yield url


@pytest.mark.postgres
@pytest.mark.parametrize("route", ["openai-batch", "echo"])  # echo: a direct route, its answers written by a thread
def test_a_worker_whose_connection_is_cut_exits_with_lowtides_message(own_schema, tmp_path, route):
    pg_schema_url = own_schema
    killtest = _harness()
    server = killtest.Server(tmp_path)
    app = f"lowtide-cut-{os.getpid()}-{tmp_path.name[-12:]}"
    url = f"{pg_schema_url}&application_name={app}"
    source = tmp_path / "tickets.csv"
    rows = 300 if route == "openai-batch" else 3000  # echo answers at once: enough dispatches to be cut among
    killtest.write_source(source, rows, trial=0)
    options = server.options(100) if route == "openai-batch" else {"dispatch_size": 50}
    spec = {"name": "cut", "source": {"path": str(source), "id_column": "ticket_id"}, "template": {"user": "{{ body }}"},
            "model": "gpt-4o-mini", "route": route, "route_options": options}  # fmt: skip
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    env = dict(os.environ) | {killtest.KEY_ENV: "sk-cut"}
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    worker = None
    store = sa.create_engine(pg_schema_url)
    locker = sa.create_engine(pg_schema_url)
    try:
        assert subprocess.run([killtest.LOWTIDE, "--db", url, "submit", "job.yaml"], cwd=tmp_path, env=env).returncode == 0
        worker = subprocess.Popen([killtest.LOWTIDE, "--db", url, "worker"], cwd=tmp_path, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 120  # safety nets for a worker that never gets there, not timing assumptions
        while worker.poll() is None and time.monotonic() < deadline:  # at work: past opening the store, a chunk claimed
            with store.connect() as conn:
                if conn.execute(sa.text("SELECT COUNT(*) FROM dispatches")).scalar_one():
                    break
        # Cut while a statement runs, not between them (an idle pooled connection is replaced
        # unseen: pre-ping): the table every tick reads is held, so the worker's next statement
        # waits inside its transaction; then its connections are ended.
        with locker.connect() as held:
            held.execute(sa.text("LOCK TABLE dispatches IN ACCESS EXCLUSIVE MODE"))
            deadline = time.monotonic() + 120
            waiting = 0
            while not waiting and worker.poll() is None and time.monotonic() < deadline:
                with admin.connect() as conn:
                    waiting = conn.execute(sa.text("SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = :a "
                                                   "AND wait_event_type = 'Lock'"), {"a": app}).scalar_one()  # fmt: skip
            assert waiting, "the worker never waited on the held table"
            with admin.connect() as conn:
                conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :a"), {"a": app})
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(60)
            held.rollback()
        assert worker.poll() is not None, "the worker kept running with its connections cut"
        err = worker.stderr.read()
        assert worker.returncode == 3, err
        # The reason is the driver's: the termination notice, or the closed socket when the notice is not read first.
        assert err.startswith("lowtide: lost the store's database connection ("), err
        assert "unexpected error" not in err and "Traceback" not in err
        with store.connect() as conn:
            twice = conn.execute(sa.text("SELECT COUNT(*) FROM (SELECT request_id FROM attempts WHERE applied "
                                         "GROUP BY request_id HAVING COUNT(*) > 1) t")).scalar_one()  # fmt: skip
            assert twice == 0
            assert conn.execute(sa.text("SELECT COUNT(*) FROM requests")).scalar_one() == rows  # nothing stored was lost
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        admin.dispose()
        store.dispose()
        locker.dispose()
        server.stop()

