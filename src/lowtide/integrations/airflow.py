"""lowtide inside Airflow: a deferrable operator that holds no worker slot while a batch runs.

    from lowtide.integrations.airflow import LowtideJobOperator

    LowtideJobOperator(
        task_id="tag_tickets",
        spec="/opt/jobs/tag-tickets.yaml",              # a spec file, or a dict
        overrides={"name": "tag-tickets-{{ ds }}",       # templated, merged into the spec
                   "source": {"path": "/data/tickets/{{ ds }}.csv"}},
        db="postgresql://…/lowtide",                     # the store; LOWTIDE_DB or ./lowtide.db by default
        results_path="/data/tagged/{{ ds }}.parquet",    # written when the job ends
        fail_on="any_failed",
    )

`execute` loads the spec and stores the job's rows (before anything is sent, as `lowtide
run` does), then defers to `LowtideJobTrigger`. The trigger ticks the job from the
triggerer, each tick a fresh engine on a thread of its own (as `lowtide tick` from cron
does: every step is in the store), until every request is terminal; or, with
`tick=False`, only watches the store while `lowtide worker`s drive it. Nothing about the job
lives in the trigger but its name and store: a triggerer that dies is replaced by one that
carries on from the store, and a retried task finds its rows stored and its batches
submitted, so no provider batch is created twice (engine: submit exactly once).

The task returns a small XCom: job, state, counts, cost and savings in USD, and the results
path. It fails by `fail_on`: `any_failed` (a request failed or was cancelled),
`all_failed` (none succeeded), `never`. A spec that does not load, a job of that name
stored from another spec, or a store that cannot be opened fails the task at once with
lowtide's message, before anything is sent, and is not retried (`AirflowFailException`).

The `spec` is not rendered by Airflow (its own `{{ column }}` templates are lowtide's, for
each row); `overrides`, `spec` given as a path, `db` and `results_path` are.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from lowtide.integrations import FAIL_ON, FailOn, job_failure, require

require("airflow", "airflow", minimum=(2, 10))

from airflow.sdk import BaseOperator  # noqa: E402
from airflow.sdk.exceptions import AirflowException, AirflowFailException  # noqa: E402
from airflow.triggers.base import BaseTrigger, TriggerEvent  # noqa: E402

from lowtide.core.errors import InputError  # noqa: E402

TRIGGER_PATH = "lowtide.integrations.airflow.LowtideJobTrigger"


def summary(db: str | None, job: str, results_path: str | None = None) -> dict[str, Any]:
    """The XCom: what a downstream task needs to know of the job (small: no rows)."""
    from lowtide.engine.control import job_status
    from lowtide.engine.report import cost_report
    from lowtide.store.db import Store

    store = Store(db, create=False)
    try:
        status = job_status(store, job)
        total = cost_report(store, job=job).total
        if results_path:
            from lowtide.engine.export import export_results

            results_path = str(export_results(store, job, results_path).path)
    finally:
        store.close()
    money = (lambda d: None if d is None else float(d))  # noqa: E731 - XCom is JSON
    return {
        "job": job, "state": status.state, "counts": dict(status.counts),
        "cost_usd": money(total.usd), "realtime_usd": money(total.realtime_usd), "savings_usd": money(total.saving_usd),
        "results_path": results_path,
    }  # fmt: skip


class LowtideJobTrigger(BaseTrigger):
    """Ticks (or, `tick=False`, watches) one job in the triggerer until it ends; fires
    `{"status": "done", "job": …}`, or `{"status": "error", "message": …}`."""

    def __init__(self, job: str, db: str | None = None, poll_interval: float = 30.0, tick: bool = True):
        super().__init__()
        self.job, self.db, self.poll_interval, self.tick = job, db, float(poll_interval), tick

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return TRIGGER_PATH, {"job": self.job, "db": self.db, "poll_interval": self.poll_interval, "tick": self.tick}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            while True:
                done, busy = await asyncio.to_thread(step, self.db, self.job, self.tick)
                if done:
                    yield TriggerEvent({"status": "done", "job": self.job})
                    return
                if not busy:  # nothing moved: wait for the providers (a busy tick goes again at once)
                    await asyncio.sleep(self.poll_interval)
        except InputError as err:
            yield TriggerEvent({"status": "error", "job": self.job, "message": str(err)})


def step(db: str | None, job: str, tick: bool = True) -> tuple[bool, bool]:
    """One tick of `job` on a fresh engine (or none, to watch): (job ended, tick was busy)."""
    from lowtide.engine.control import job_done
    from lowtide.engine.tick import Engine
    from lowtide.store.db import Store

    store = Store(db, create=False)
    try:
        busy = False
        if tick:

            async def once() -> bool:
                async with Engine(store) as engine:
                    return (await engine.tick(job)).busy

            busy = asyncio.run(once())
        return job_done(store, job), busy
    finally:
        store.close()


class LowtideJobOperator(BaseOperator):
    """Run a lowtide job as one task, deferred while its batches run (module doc)."""

    template_fields = ("spec_file", "overrides", "db", "results_path")
    ui_color = "#cfe8f3"

    def __init__(
        self,
        *,
        spec: str | Path | dict[str, Any],
        overrides: dict[str, Any] | None = None,
        db: str | None = None,
        results_path: str | None = None,
        fail_on: FailOn = "any_failed",
        poll_interval: float = 30.0,
        tick: bool = True,
        deferrable: bool = True,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if fail_on not in FAIL_ON:
            raise ValueError(f"fail_on={fail_on!r}: give one of {', '.join(FAIL_ON)}")
        self.spec_file = str(spec) if isinstance(spec, str | Path) else None
        self.spec_dict = dict(spec) if isinstance(spec, dict) else None
        self.overrides, self.db, self.results_path = overrides, db, results_path
        self.fail_on, self.poll_interval, self.tick, self.deferrable = fail_on, poll_interval, tick, deferrable

    def execute(self, context: Any) -> dict[str, Any]:
        from lowtide.api import Job

        try:
            job = Job.from_spec(self.spec_file if self.spec_file is not None else self.spec_dict, self.db, self.overrides)
            try:  # rows already stored stay as they are: a retried task resumes the same job
                report = job.submit()
            finally:
                job.store.close()
        except InputError as err:  # lowtide's message (file, field, fix); retrying cannot help
            raise AirflowFailException(str(err)) from None
        spec = job.spec
        self.log.info("lowtide job %s: %s rows, %s new", spec.name, report.rows, report.new)
        if not self.deferrable:
            while not step(self.db, spec.name, self.tick)[0]:
                time.sleep(self.poll_interval)
            return self._finish(spec.name)
        self.defer(
            trigger=LowtideJobTrigger(spec.name, self.db, self.poll_interval, self.tick), method_name="execute_complete",
            kwargs={"job": spec.name},
        )  # fmt: skip

    def execute_complete(self, context: Any, event: dict[str, Any], job: str | None = None) -> dict[str, Any]:
        if event.get("status") != "done":
            raise AirflowException(event.get("message") or f"lowtide trigger for {job!r} ended with {event!r}")
        return self._finish(event["job"])

    def _finish(self, job: str) -> dict[str, Any]:
        result = summary(self.db, job, self.results_path)
        self.log.info("lowtide job %s ended: %s", job, result)
        why = job_failure(job, result["state"], result["counts"], self.fail_on, again="clear the task")
        if why:
            raise AirflowFailException(why)
        return result
