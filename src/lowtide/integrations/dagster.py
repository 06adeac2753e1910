"""lowtide inside Dagster: a resource for the store and an asset factory whose asset is a
job's results (docs/dagster.md).

    from dagster import DailyPartitionsDefinition, Definitions
    from lowtide.integrations.dagster import LowtideResource, lowtide_asset

    tagged_tickets = lowtide_asset(
        spec="jobs/tag-tickets.yaml",                         # a spec file, or a dict
        name="tagged_tickets",                                # the asset
        partitions_def=DailyPartitionsDefinition(start_date="2026-12-01"),
        overrides={"source": {"path": "/data/tickets/{partition}.csv"}},
        fail_on="any_failed",
    )
    defs = Definitions(assets=[tagged_tickets], resources={"lowtide": LowtideResource(db="postgresql://…/lowtide")})

Each materialisation is one lowtide job. `{partition}` in any string of `overrides` (and in
`results_path`) is the partition key; a partitioned asset's job is named
`<spec name>-<partition key>` unless `overrides` names it. The asset loads the spec, stores
the job's rows (as `lowtide run` does, before anything is sent), drives the job to its end
and hands its results on: a pandas DataFrame to the asset's IO manager, or, with
`results_path`, a file lowtide writes (CSV, JSONL or Parquet by extension). Counts by state,
cost, real-time cost and savings in USD, failures and their commonest reasons, the job's
name and the results path are the materialisation's metadata.

The store is the only memory: a retried or repeated materialisation of a partition finds
its job by name, rows stored and batches submitted, and carries on; nothing is sent twice.
A spec that does not load, a job of that name stored from another spec, or a store that
cannot be opened fails the materialisation at once with lowtide's message and no retry
(`dagster.Failure(allow_retries=False)`), before anything is sent. The job's own outcome
fails it by `fail_on`: `any_failed` (a request failed or was cancelled), `all_failed` (none
succeeded) or `never`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lowtide.integrations import FAIL_ON, FailOn, counted, job_failure, require

require("dagster", "dagster", minimum=(1, 8), below=(2,))

import dagster as dg  # noqa: E402

from lowtide.api import Job  # noqa: E402
from lowtide.core.errors import InputError, StoreError  # noqa: E402
from lowtide.store.db import Store  # noqa: E402

PARTITION = "{partition}"
TOP_REASONS = 5


class LowtideResource(dg.ConfigurableResource):
    """Where lowtide keeps its jobs: `db`, the store (a SQLite path or a PostgreSQL URL;
    unset: LOWTIDE_DB, else ./lowtide.db in the run's folder), and `results_dir`, the folder a
    relative `results_path` is under (unset: the run's folder). Every process that
    materialises or works on the jobs must see the same store."""

    db: str | None = None
    results_dir: str | None = None

    def store(self) -> Store:
        return Store(self.db)

    def results_file(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() or self.results_dir is None else Path(self.results_dir).expanduser() / p


def lowtide_asset(
    *,
    spec: str | Path | dict[str, Any],
    name: str,
    partitions_def: dg.PartitionsDefinition | None = None,
    overrides: dict[str, Any] | None = None,
    results_path: str | None = None,
    fail_on: FailOn = "any_failed",
    resource_key: str = "lowtide",
    log_interval: float = 60.0,
    **asset_kwargs: Any,
) -> dg.AssetsDefinition:
    """A Dagster asset whose materialisation runs one lowtide job to its end (module doc).

    `spec`: a spec file or dict; `overrides`: merged into it, `{partition}` in any string
    replaced by the partition key; `results_path`: write the results there and keep them out
    of the IO manager (else the asset's value is the results DataFrame); `fail_on`:
    any_failed, all_failed or never; `resource_key`: the LowtideResource's key;
    `log_interval`: seconds between progress lines in the run's log. Other keyword
    arguments go to `dagster.asset` (group_name, key_prefix, deps, retry_policy, …)."""
    if fail_on not in FAIL_ON:
        raise ValueError(f"lowtide_asset {name!r}: fail_on={fail_on!r}; give one of {', '.join(FAIL_ON)}")
    if partitions_def is None and (PARTITION in repr(overrides) or PARTITION in (results_path or "")):
        raise ValueError(f"lowtide_asset {name!r}: {PARTITION} is used but the asset has no partitions_def; give one, or leave {PARTITION} out")
    spec = spec if isinstance(spec, dict) else str(spec)
    asset_kwargs.setdefault("description", f"The results of the lowtide job of {spec if isinstance(spec, str) else 'a spec dict'}.")

    @dg.asset(name=name, partitions_def=partitions_def, required_resource_keys={resource_key}, **asset_kwargs)
    def _lowtide_asset(context):  # no annotations: Dagster reads them, and here they are strings
        resource: LowtideResource = getattr(context.resources, resource_key)
        key = context.partition_key if partitions_def is not None else None
        try:
            store = resource.store()
        except StoreError as err:
            raise dg.Failure(f"lowtide: {err}", allow_retries=False) from None
        try:
            job = _load(spec, overrides, key, store)
            context.log.info(f"lowtide job {job.name}: loading its rows (rows already stored are kept)")
            job.start()  # stores the rows first: bad input is refused here, before anything is sent
            while not job.done():
                status = job.wait(timeout=log_interval)
                if not job.done():
                    context.log.info(f"lowtide job {job.name}: {status.state}, {counted(status.counts)}")
            status = job.wait()
            metadata = _metadata(job, status)
            why = job_failure(job.name, status.state, status.counts, fail_on, again="materialise again")
            if why:
                raise dg.Failure(f"lowtide: {why}", metadata=metadata, allow_retries=False)
            if results_path is not None:
                path = job.export(resource.results_file(results_path.replace(PARTITION, key or "")))
                return dg.MaterializeResult(metadata={**metadata, "results_path": dg.MetadataValue.path(str(path))})
            frame = job.results()
            return dg.Output(frame, metadata={**metadata, "dagster/row_count": len(frame)})
        except InputError as err:  # lowtide's message (file, field, fix); a retry cannot help
            raise dg.Failure(f"lowtide: {err}", allow_retries=False) from None
        finally:
            store.close()

    return _lowtide_asset


def _load(spec: str | dict[str, Any], overrides: dict[str, Any] | None, key: str | None, store: Store) -> Job:
    """The partition's job: the spec with `overrides` ({partition} filled in), named
    `<spec name>-<partition key>` unless the overrides name it."""
    more = _filled(overrides or {}, key or "")
    job = Job.from_spec(spec, store, more)
    if key is not None and "name" not in more:
        job = Job.from_spec(spec, store, {**more, "name": f"{job.name}-{re.sub(r'[^A-Za-z0-9_.-]', '-', key)}"})
    _check_same_source(job)
    return job


def _check_same_source(job: Job) -> None:
    """A job of this name stored over another source file is another asset's (or another
    partition's) job: refused, where the loader would add this file's rows to it."""
    stored = job.stored_spec()
    if stored is None:
        return
    was, now = _place(stored), _place(job.spec)
    if was != now:
        raise InputError(
            f'job "{job.name}" is stored over source {was}; this asset\'s source is {now}. '
            "A job name belongs to one asset and partition: give this asset its own (overrides={\"name\": …}), "
            "or point source.path back at the stored source"
        )


def _place(spec: Any) -> str:
    """The source's place: a local path resolved, a URL or a SQL source as written."""
    from lowtide.core.locations import scheme_of

    path = spec.source.path
    if path is None or scheme_of(path) is not None:
        return spec.source.where
    return str(spec.resolve(path).resolve())


def _filled(value: Any, key: str) -> Any:
    if isinstance(value, str):
        return value.replace(PARTITION, key)
    if isinstance(value, dict):
        return {k: _filled(v, key) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v, key) for v in value]
    return value


def _metadata(job: Job, status: Any) -> dict[str, Any]:
    """What the Dagster UI shows (and plots over partitions) for one materialisation."""
    total = job.report().total
    reasons = sorted(status.failures.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]
    counts = status.counts
    return {
        "job": job.name,
        "state": status.state,
        "requests": status.total,
        "succeeded": counts.get("succeeded", 0),
        "failed": counts.get("failed", 0),
        "cancelled": counts.get("cancelled", 0),
        "counts": dg.MetadataValue.json(dict(counts)),
        "cost_usd": float(total.usd),
        "realtime_usd": float(total.realtime_usd),
        "savings_usd": float(total.saving_usd),
        "unknown_cost_attempts": total.unknown,
        "failures": counts.get("failed", 0) + counts.get("cancelled", 0),
        "top_failure_reasons": dg.MetadataValue.json(dict(reasons)),
    }
