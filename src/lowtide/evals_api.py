"""Evals from Python (docs/evals.md): `Job.from_dataframe(..., variants=...)` returns one.

    ev = lowtide.Job.from_dataframe(df, name="qa", id_column="id", user="{{ question }}",
        variants={"models": [{"name": "mini", "model": "gpt-4o-mini", "route": "openai-batch"}],
                  "prompts": [{"name": "v1", "user": "Q: {{ question }}"}]},
        scoring={"method": "exact", "expected": "answer"})
    ev.run()            # or `await ev.run_async()` in a notebook
    ev.compare()        # one row per variant, as a DataFrame
    ev.report()         # the whole report (pairs, confusion, disagreements)
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lowtide.core.clock import SystemClock
from lowtide.core.evals import EvalSpec, build_eval, load_eval
from lowtide.engine.compare import EvalReport, compare, variant_rows
from lowtide.engine.control import JobStatus
from lowtide.engine.evals import load_eval as load_members
from lowtide.engine.evals import run_eval
from lowtide.engine.loader import LoadReport
from lowtide.engine.tick import Engine
from lowtide.store.db import Store

if TYPE_CHECKING:
    import pandas as pd


class Eval:
    """An eval bound to a store: its variants run as member jobs (`EVAL.VARIANT`)."""

    def __init__(self, spec: EvalSpec, store: Store | str | None = None):
        self.spec = spec
        self.store = store if isinstance(store, Store) else Store(store)

    @classmethod
    def from_yaml(cls, path: str | Path, store: Store | str | None = None) -> Eval:
        return cls(load_eval(path), store)

    @classmethod
    def from_data(cls, data: dict[str, Any], store: Store | str | None = None) -> Eval:
        return cls(build_eval(data, where=f"eval {data.get('name')!r}"), store)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def jobs(self) -> list[str]:
        return [m.spec.name for m in self.spec.members]

    def submit(self, requeue_changed: bool = False) -> list[LoadReport]:
        return load_members(self.store, self.spec, SystemClock(), requeue_changed=requeue_changed)

    def run(self, requeue_changed: bool = False) -> list[JobStatus]:
        """Submit every variant and drive them (then the judge) to the end, blocking.
        `requeue_changed`: changed rows are answered again, and their verdicts given again.
        Inside a running event loop (a Jupyter cell) the eval is driven on a thread of its own;
        `await ev.run_async()` keeps the loop free instead."""
        self.submit(requeue_changed)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._drive(requeue_changed))
        with ThreadPoolExecutor(1, thread_name_prefix=f"lowtide-{self.name}") as pool:
            return pool.submit(asyncio.run, self._drive(requeue_changed)).result()

    async def run_async(self, requeue_changed: bool = False) -> list[JobStatus]:
        """Submit every variant and drive them to the end on the running event loop:
        `await ev.run_async()`. Storing the rows runs on a worker thread."""
        await asyncio.to_thread(self.submit, requeue_changed)
        return await self._drive(requeue_changed)

    async def _drive(self, requeue_changed: bool) -> list[JobStatus]:
        async with Engine(self.store) as engine:
            return await run_eval(engine, self.spec, SystemClock(), requeue_changed=requeue_changed)

    def report(self, disagreements: int = 20) -> EvalReport:
        return compare(self.store, self.spec, disagreements)

    def compare(self) -> pd.DataFrame:
        """One row per variant: scored, accuracy, ci_low/ci_high, failures, cost, … (the
        columns of `lowtide compare --out`)."""
        import pandas as pd

        return pd.DataFrame.from_records(variant_rows(self.report()))
