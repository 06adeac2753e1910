"""Running an eval: store its spec, load its member jobs, drive them together, then the judge.

Before any member is loaded, the things only an eval has are checked: the expected column
(present in the source; labels inside the choices; patterns and numbers that parse) and the
judge's template against the columns the first stage will produce. Then each member loads
as any job does (all-or-nothing per member; the members share one source, so a bad row is
refused on the first member, before anything is stored).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lowtide.core.clock import Clock
from lowtide.core.errors import JobNotFoundError, SourceError
from lowtide.core.evals import EvalSpec, check_judge_columns, judge_spec
from lowtide.core.scoring import check_expected
from lowtide.core.sources import source_of
from lowtide.engine.control import JobStatus, job_done, job_status
from lowtide.engine.eval_store import eval_named, save_eval, stored_eval  # noqa: F401  (their older callers' import)
from lowtide.engine.stages import Upstream, source_values, stage_rows, write_stage_source
from lowtide.store.db import Store

if TYPE_CHECKING:
    from lowtide.engine.loader import LoadReport
    from lowtide.engine.tick import Engine

STAGE_DIR = "lowtide-stages"  # under the spec's folder: the judge's source files


def check_eval(ev: EvalSpec) -> None:
    """What an eval adds to its members' checks: its expected column(s) and judge template."""
    spec = ev.base
    source = source_of(spec)
    columns = source.columns
    s = ev.scoring
    if s is not None:
        wanted = list(s.fields.values()) if s.method == "json_fields" else [s.expected] if s.expected else []
        if columns is not None:
            for col in wanted:
                if col not in columns:
                    raise SourceError(
                        f'{source.label}: no column "{col}" (scoring.{"fields" if s.method == "json_fields" else "expected"}); '
                        f"columns are: {', '.join(columns)}. Name the column with the expected answers"
                    )
        if s.method in ("choice", "regex", "numeric"):
            values = ((row.where(source.name), row.values.get(s.expected)) for chunk in source.chunks() for row in chunk)
            problems = check_expected(s, values, spec.effective_choices, str)
            if problems:
                raise SourceError.from_problems(f"{source.label}: refused, nothing was stored", problems)
    if ev.parts.judge is not None:
        check_judge_columns(ev, list(columns or []))


def load_eval(
    store: Store,
    ev: EvalSpec,
    clock: Clock,
    on_member: Callable[[str, LoadReport], None] | None = None,
    requeue_changed: bool = False,
) -> list[LoadReport]:
    """Check the eval, store it and load every member; members already stored add only what
    is new (a new variant is a new member: the stored ones are not changed by it)."""
    # The run path, imported here: a caller that only reads evals back never loads it.
    from lowtide.engine.loader import load_job

    check_eval(ev)
    save_eval(store, ev, clock.now())
    reports = []
    for m in ev.members:
        report = load_job(store, m.spec, clock, f"{ev.where} (variant {m.variant})", requeue_changed=requeue_changed)
        reports.append(report)
        if on_member:
            on_member(m.variant, report)
    return reports


async def drive_jobs(
    engine: Engine,
    names: list[str],
    on_tick: Callable[[list[JobStatus]], None] | None = None,
    every: float = 0.5,
    on_idle: Callable[[float], Awaitable[None]] | None = None,
) -> list[JobStatus]:
    """Tick several jobs until each is done: their batches are in flight together. When
    nothing was due, `on_idle(seconds)` waits (default: sleeps; a test moves its clock)."""
    from lowtide.engine.runner import IDLE_WAIT_MAX  # the run path, as in load_eval

    left = list(names)
    last = 0.0
    while left:
        busy = False
        for name in list(left):
            report = await engine.tick(name)
            busy = busy or report.busy
            if job_done(engine.store, name):
                left.remove(name)
        if on_tick and (not left or time.monotonic() - last >= every):
            on_tick([job_status(engine.store, n) for n in names])
            last = time.monotonic()
        if left and not busy:
            due = engine.next_due()
            wait = IDLE_WAIT_MAX if due is None else min(IDLE_WAIT_MAX, max(0.01, due - engine.clock.now()))
            await (on_idle or asyncio.sleep)(wait)
    return [job_status(engine.store, n) for n in names]


def stage_path(ev: EvalSpec) -> Path:
    return ev.base.resolve(STAGE_DIR) / f"{ev.judge_name}.jsonl"


def judge_rows(store: Store, ev: EvalSpec, values: dict[str, dict] | None = None) -> tuple[list[dict], list[str]]:
    """The judge's rows as the members' succeeded answers make them now, and the source's
    columns; `values`: the source's rows by key (`source_values`), if read already."""
    s = ev.scoring
    expected = {"expected": s.expected} if s is not None and s.expected else {}
    ups = [
        Upstream(m.spec.name, {"variant": m.variant, "model": m.spec.model, "prompt": m.prompt}, expected)
        for m in ev.members
    ]
    values = source_values(ev.base) if values is None else values
    return stage_rows(store, ups, values), list(next(iter(values.values()), {}).keys())


def load_judge(store: Store, ev: EvalSpec, clock: Clock, requeue_changed: bool = False) -> LoadReport | None:
    """Write the judge's source from the members' succeeded answers and load the judge job.
    None when there is no judge or nothing to judge. Rows already judged are left alone; a
    row whose answer changed since it was judged (the member re-ran it, `--requeue-changed`)
    is, with `requeue_changed`, judged again (its old verdict kept as an earlier version);
    without it the verdict is kept, and compare leaves it unscored (it is on an older answer)."""
    if ev.parts.judge is None:
        return None
    rows, columns = judge_rows(store, ev)
    if not rows:
        return None
    from lowtide.engine.loader import load_job

    path = write_stage_source(stage_path(ev), rows)
    spec = judge_spec(ev, path, columns)
    return load_job(store, spec, clock, f"{ev.where} judge", requeue_changed=requeue_changed)


async def run_eval(
    engine: Engine,
    ev: EvalSpec,
    clock: Clock,
    on_tick: Callable[[list[JobStatus]], None] | None = None,
    on_idle: Callable[[float], Awaitable[None]] | None = None,
    requeue_changed: bool = False,
) -> list[JobStatus]:
    """Drive the members to the end, then the judge stage over their answers. A judge left
    unfinished by an earlier run is driven with the members: a changed answer can be judged
    again only once its old verdict is no longer in a batch in flight."""
    names = [m.spec.name for m in ev.members]
    earlier = [ev.judge_name] if ev.parts.judge is not None and _unfinished(engine.store, ev.judge_name) else []
    statuses = await drive_jobs(engine, names + earlier, on_tick, on_idle=on_idle)
    if load_judge(engine.store, ev, clock, requeue_changed) is not None:
        statuses = statuses[: len(names)] + await drive_jobs(engine, [ev.judge_name], on_tick, on_idle=on_idle)
    return statuses


def _unfinished(store: Store, name: str) -> bool:
    try:
        return not job_done(store, name)
    except JobNotFoundError:
        return False
