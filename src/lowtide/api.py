"""The Python face of lowtide, for scripts and notebooks.

    import lowtide
    job = lowtide.Job.from_dataframe(
        df, name="tag-reviews", id_column="review_id",
        user="Tag this review: {{ text }}", choices=["praise", "complaint", "question"],
        model="smollm2-135m-instruct", route="local",
    )
    job.run()                  # blocks until every row is done; job.start() does not block
    await job.run_async()      # the same, in a notebook or any running event loop
    df_out = job.results()     # the input rows plus output, state, error, tokens, tool_calls, …
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lowtide.core.clock import SystemClock
from lowtide.core.errors import JobNotFoundError
from lowtide.core.output_target import OutputTarget, output_target
from lowtide.core.spec import JobSpec, build_spec, load_spec
from lowtide.core.yamlfile import parse_mapping, read_text
from lowtide.engine.control import JobStatus, cancel_job, job_spec, job_status, retry_job
from lowtide.engine.export import ExportReport, ResultRows, export_results, write_target
from lowtide.engine.loader import LoadReport, load_job
from lowtide.engine.preflight import check_target
from lowtide.engine.report import CostReport, cost_report
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.store.db import Store

if TYPE_CHECKING:
    import pandas as pd

    from lowtide.evals_api import Eval


class Job:
    """A job bound to a store. Every method goes through the same engine as the CLI."""

    def __init__(self, spec: JobSpec, store: Store | str | None = None):
        self.spec = spec
        self.store = store if isinstance(store, Store) else Store(store)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.written: ExportReport | None = None  # where run() wrote the spec's `output`, if it names one

    @classmethod
    def from_yaml(cls, path: str | Path, store: Store | str | None = None) -> Job:
        return cls(load_spec(path), store)

    @classmethod
    def from_spec(
        cls, spec: str | Path | dict[str, Any], store: Store | str | None = None, overrides: dict[str, Any] | None = None
    ) -> Job:
        """A job from a spec file or dict, with `overrides` merged in (a nested mapping key by
        key): how a scheduler gives each run its own name and source path. Every problem is
        lowtide's message naming the file (or `job spec`), the field and, for a key of the
        file that no override replaced, its line."""
        if isinstance(spec, dict):
            data, where, lines = dict(spec), "job spec", None
        else:
            path = Path(spec)
            data, lines = parse_mapping(read_text(path, "job spec"), str(path), "a job spec is a YAML mapping with keys name, source, template, model, route")
            data.setdefault("base_dir", str(path.parent.resolve()))
            where = str(path)
            replaced = list(_leaf_paths(overrides or {}))
            lines = {key: line for key, line in lines.items() if not any(key[: len(r)] == r for r in replaced)}
        return cls(build_spec(merged(data, overrides or {}), where=where, lines=lines), store)

    @classmethod
    def from_dataframe(
        cls,
        df: pd.DataFrame,
        *,
        name: str,
        id_column: str,
        model: str | None = None,
        route: str | None = None,
        user: str | None = None,
        system: str | None = None,
        optional_columns: list[str] | None = None,
        source: dict[str, Any] | None = None,
        template: dict[str, Any] | None = None,
        store: Store | str | None = None,
        source_dir: str | Path = "lowtide-sources",
        variants: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Job | Eval:
        """A job over a DataFrame. The frame is saved as Parquet under `source_dir` so the
        job stays resumable from the CLI, like any file-based job. With `variants` (and then
        no `model`/`route`: each variant model brings its own) it is an eval
        (lowtide.evals_api.Eval, docs/evals.md): `.run()`, then `.compare()`.

        Every source option of a spec is taken: `optional_columns` (cells that may be empty
        or NaN), or any other in `source={...}`; likewise any template key in `template={...}`
        (images, files, messages_column, …). Other keyword arguments are spec keys."""
        folder = Path(source_dir)
        folder.mkdir(parents=True, exist_ok=True)
        path = (folder / f"{name}.parquet").resolve()
        df.to_parquet(path, index=False)
        source_keys = {**(source or {}), "path": str(path), "id_column": id_column}
        if optional_columns is not None:
            source_keys["optional_columns"] = list(optional_columns)
        template_keys = {**(template or {})}
        for key, value in (("user", user), ("system", system)):
            if value is not None:
                template_keys[key] = value
        data = {
            "name": name,
            "source": source_keys,
            "template": template_keys,
            **({"model": model} if model is not None else {}),
            **({"route": route} if route is not None else {}),
            **fields,
        }
        if variants is not None:
            from lowtide.evals_api import Eval

            return Eval.from_data(data | {"variants": variants}, store)
        spec = build_spec(data, where=f"Job.from_dataframe({name!r})")
        return cls(spec, store)

    @property
    def name(self) -> str:
        return self.spec.name

    def submit(self, requeue_changed: bool = False) -> LoadReport:
        """Check and store the job's rows; rows already stored are left alone. A spec change
        that alters stored requests is refused unless `requeue_changed` (docs/jobs.md)."""
        return load_job(self.store, self.spec, SystemClock(), f"job {self.name!r}", requeue_changed=requeue_changed)

    def run(self, progress: bool = True) -> JobStatus:
        """Submit and drive the job to the end, blocking. Inside a running event loop (a
        Jupyter cell) the job is driven on a thread of its own, so this works there too;
        `await job.run_async()` keeps the loop free instead.

        A spec that names an `output` (a file, an object-store URL, a partitioned folder or a
        SQL table) gets its results written there at the end, as `lowtide run` does; a bad
        target is refused before anything is stored or sent. `job.written` says what was written."""
        target = self._output()
        self.submit()
        status = self._drive_blocking(progress)
        self._write(target)
        return status

    def _drive_blocking(self, progress: bool) -> JobStatus:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._drive(progress))
        result: list[JobStatus] = []
        errors: list[BaseException] = []

        def target() -> None:
            try:
                result.append(asyncio.run(self._drive(progress)))
            except BaseException as err:  # raised again on the caller's thread
                errors.append(err)

        thread = threading.Thread(target=target, name=f"lowtide-{self.name}", daemon=True)
        thread.start()
        thread.join()
        if errors:
            raise errors[0]
        return result[0]

    async def run_async(self, progress: bool = True) -> JobStatus:
        """Submit and drive the job to the end on the running event loop: `await job.run_async()`.
        Storing the rows (and writing the spec's `output`, as `run` does) runs on a worker
        thread, so the loop stays responsive."""
        target = self._output()
        await asyncio.to_thread(self.submit)
        status = await self._drive(progress)
        await asyncio.to_thread(self._write, target)
        return status

    def _output(self) -> OutputTarget | None:
        """The spec's `output`, checked before the run (a file only inside the spec's folder;
        a table that can take the results)."""
        target = output_target(self.spec, None)
        if target is not None:
            check_target(self.spec, target)
        return target

    def _write(self, target: OutputTarget | None) -> None:
        if target is not None:
            self.written = write_target(self.store, self.name, target)

    def start(self) -> None:
        """Submit, then drive the job in a background thread (and write the spec's `output`,
        as `run` does); see `done()` and `wait()`."""
        output = self._output()
        self.submit()

        def target() -> None:
            try:
                asyncio.run(self._drive())
                self._write(output)
            except BaseException as err:  # surfaced by wait()
                self._error = err

        self._thread = threading.Thread(target=target, name=f"lowtide-{self.name}", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> JobStatus:
        if self._thread is not None:
            self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        return self.status()

    async def _drive(self, progress: bool = False) -> JobStatus:
        if not progress:
            async with Engine(self.store) as engine:
                return await drive(engine, self.name)
        from rich.console import Console

        from lowtide.engine.progress import JobProgress

        # A live bar on a terminal; plain lines in a notebook or a pipe; a summary at the end.
        with JobProgress(Console(stderr=True), f"run {self.name}", summary=True) as shown:
            async with Engine(self.store) as engine:
                # A few indexed counts at most once a second, not the whole status per tick.
                return await shown.watch(drive(engine, self.name), self.store, self.name)

    def status(self) -> JobStatus:
        return job_status(self.store, self.name)

    def cancel(self) -> int:
        return cancel_job(self.store, self.name, SystemClock())

    def retry(self, failed: bool = True, cancelled: bool = False) -> int:
        return retry_job(self.store, self.name, SystemClock(), failed=failed, cancelled=cancelled)

    def results(self, full: bool = False) -> pd.DataFrame:
        """The source rows joined by custom_id to their results, as a DataFrame (nested
        values as dicts and lists; `full` adds each provider's whole answer, `response`)."""
        import pandas as pd

        rows = ResultRows(self.store, self.name, full=full)
        frames = [pd.DataFrame.from_records(chunk) for chunk in rows.chunks()]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def export(self, path: str | Path, full: bool = False) -> Path:
        return export_results(self.store, self.name, path, full=full).path

    def stored_spec(self) -> JobSpec | None:
        """The spec the store holds for a job of this name, or None if there is none yet."""
        try:
            return job_spec(self.store, self.name)
        except JobNotFoundError:
            return None

    def report(self) -> CostReport:
        """The job's cost, real-time cost and saving, as `lowtide report --job NAME` shows them."""
        return cost_report(self.store, job=self.name)


def _leaf_paths(mapping: dict[str, Any], above: tuple[str, ...] = ()) -> Any:
    for key, value in mapping.items():
        yield from _leaf_paths(value, (*above, key)) if isinstance(value, dict) else [(*above, key)]


def merged(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """`base` with `more` merged in: nested mappings key by key, anything else replaced."""
    out = dict(base)
    for key, value in more.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
