"""A job's direct-route requests on a local Ray instance (2 CPUs): the engine and the store on
the driver, one route instance per actor."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from lowtide.store.schema import attempts, requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _pool(**kw):
    from lowtide.routes.pool.ray import RayPool

    return RayPool("echo", {}, actors=2, num_cpus=0.5, shard_size=16, **kw)


def test_a_job_runs_on_ray_actors_and_every_row_gets_its_answer(local_ray, sqlite_store, clock, tmp_path):
    from lowtide.engine.tick import Engine

    source = write_csv(tmp_path / "t.csv", ticket_rows(300))
    spec = make_spec(source, choices=["billing", "technical", "account", "shipping", "feedback"])
    pool = _pool()
    status = drive_to_end(sqlite_store, spec, clock, engine=Engine(sqlite_store, clock, routes={"echo": pool}))
    assert status.counts == {"succeeded": 300}
    with sqlite_store.begin() as conn:
        rows = conn.execute(sa.select(requests.c.custom_id, requests.c.output, requests.c.route)).all()
    labels = ["billing", "technical", "account", "shipping", "feedback"]
    assert {(cid, out) for cid, out, _ in rows} == {(f"T{1000 + i}", labels[i % 5]) for i in range(300)}
    assert {route for *_, route in rows} == {"echo"}


def test_requests_of_an_actor_that_died_are_sent_again_on_a_new_one(local_ray, sqlite_store, clock, tmp_path):
    from lowtide.engine.tick import Engine

    source = write_csv(tmp_path / "t.csv", ticket_rows(100))
    spec = make_spec(source, retry={"max_attempts": 3, "backoff_seconds": 0})
    pool = _pool()
    ray.kill(pool._actors[0], no_restart=True)  # a node lost before the job starts
    status = drive_to_end(sqlite_store, spec, clock, engine=Engine(sqlite_store, clock, routes={"echo": pool}))
    assert status.counts == {"succeeded": 100}
    with sqlite_store.begin() as conn:
        lost = conn.execute(
            sa.select(sa.func.count()).select_from(attempts).where(attempts.c.error_code == "route_error")
        ).scalar_one()
        applied = conn.execute(
            sa.select(sa.func.count()).select_from(attempts).where(attempts.c.applied, attempts.c.ok)
        ).scalar_one()
    assert lost > 0  # the dead actor's shards failed ...
    assert applied == 100  # ... and were answered once each on the replacement
