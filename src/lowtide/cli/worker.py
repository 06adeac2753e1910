"""Commands that run the engine over every job: tick (one pass, for cron) and worker (a loop)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated

import typer

from lowtide.cli.common import EXIT_INTERRUPTED, console, fail, open_store
from lowtide.cli.traces import TraceTo, check_trace_to, export_ended
from lowtide.core.errors import LowtideError
from lowtide.core.spec import stored_spec
from lowtide.core.states import JobState
from lowtide.engine.runner import work
from lowtide.engine.tick import Engine, TickReport
from lowtide.store.queries import list_jobs


def _describe(report: TickReport) -> str:
    i = report.ingested
    return (
        f"planned {report.planned}, submitted {report.submitted} batch(es), "
        f"{i.succeeded} succeeded, {i.retried} to retry, {i.failed} failed, {i.stale} stale, "
        f"{report.reclaimed} reclaimed" + (f"; finished: {', '.join(report.finished)}" if report.finished else "")
    )


def tick(
    job: Annotated[str | None, typer.Option(help="Only this job.")] = None,
) -> None:
    """Run one non-blocking pass: submit what is planned, poll what is due, ingest what ended.

    Made for cron: `* * * * * cd /srv/jobs && lowtide tick`.

    Example: lowtide tick
    """

    async def go() -> TickReport:
        with open_store() as store:
            async with Engine(store) as engine:
                return await engine.tick(job)

    try:
        report = asyncio.run(go())
    except LowtideError as err:
        raise fail(err) from None
    console.print(_describe(report), soft_wrap=True)  # one line a log can grep, whatever the width


def worker(
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Stop when nothing is left to do.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print every busy tick.")] = False,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Run the routes named by --ray-route on Ray actors: `local` starts Ray on this machine; "
            "`auto` or ray://HOST:10001 joins a cluster (docs/ray.md).",
            show_default=False,
        ),
    ] = None,
    ray_route: Annotated[list[str], typer.Option("--ray-route", help="A direct route to run on Ray (repeatable).")] = [],  # noqa: B006
    ray_actors: Annotated[int, typer.Option(help="Actors (model engines) per route.", min=1)] = 2,
    ray_cpus: Annotated[float, typer.Option(help="CPUs per actor.")] = 1.0,
    ray_gpus: Annotated[float, typer.Option(help="GPUs per actor.")] = 0.0,
    trace_to: TraceTo = None,
) -> None:
    """Tick every job in a loop. Stop it any time: the next worker continues from the store.

    Example: lowtide worker --until-idle
    Example: lowtide worker --ray auto --ray-route local --ray-actors 8 --ray-cpus 2
    """
    if ray_route and ray is None:
        raise typer.BadParameter("--ray-route needs --ray (local, auto or a ray:// address)", param_hint="--ray-route")
    check_trace_to(trace_to)
    # --trace-to: a finished job's trace is sent from one thread beside the loop, which goes on ticking.
    tracer = ThreadPoolExecutor(1, thread_name_prefix="lowtide-trace") if trace_to else None

    async def go() -> None:
        with open_store() as store:

            def on_tick(report: TickReport) -> None:
                if verbose and report.busy:
                    console.print(_describe(report), soft_wrap=True)  # one line a log can grep, whatever the width
                if tracer is not None and report.finished:
                    tracer.submit(export_ended, store, list(report.finished), trace_to)

            pools = _ray_pools(store, ray, ray_route, ray_actors, ray_cpus, ray_gpus) if ray else {}
            try:
                async with Engine(store, routes=pools) as engine:
                    await work(engine, on_tick, stop_when_idle=until_idle)
            finally:
                if tracer is not None:
                    tracer.shutdown(wait=True)  # before the store closes: traces already due are sent

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        console.print("worker stopped")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except LowtideError as err:
        raise fail(err) from None


def _ray_pools(store, address: str, routes: list[str], actors: int, cpus: float, gpus: float) -> dict:
    """One RayPool per named route, with the route options of the first active job using it."""
    from lowtide.routes.pool.ray import RayPool

    with store.read() as conn:
        specs = [stored_spec(r.spec) for r in list_jobs(conn, [JobState.ACTIVE])]
    options: dict[str, dict] = {}
    for spec in specs:
        for route, route_options, _ in spec.sending_routes:  # the route; its fallback, or its chain's tiers
            options.setdefault(route, route_options)
    return {
        name: RayPool(
            name, options.get(name, {}), actors=actors, num_cpus=cpus, num_gpus=gpus,
            address=None if address == "local" else address,
        )  # fmt: skip
        for name in routes
    }
