"""The simulation's long form: more seeds and more steps than CI runs (tests/sim).

    .venv/bin/python bench/simulate.py --steps 60 --seeds 20
    .venv/bin/python bench/simulate.py --steps 40 --seeds 5 --store postgres --route openai-batch
    .venv/bin/python bench/simulate.py --route gemini-batch --store sqlite --seed 3 --seeds 1 --examples 4 --steps 25
    .venv/bin/python bench/simulate.py --route mistral-batch --store sqlite --seeds 3 --examples 8 --steps 40
    .venv/bin/python bench/simulate.py --route bedrock-batch --store sqlite --seeds 3 --examples 4 --steps 30
    .venv/bin/python bench/simulate.py --route gateway --store both --seeds 5 --examples 6 --steps 40

Each seed runs `--examples` drawn sequences of up to `--steps` steps (load, append, tick,
kill, cancel, retry, spec change, budget, deadline, clock steps, provider faults) on each
route and store asked for (`--route`, or all ten: openai-batch, anthropic-batch,
gemini-batch, echo-batch, openai-compatible-batch, azure-batch, mistral-batch,
openrouter-batch, vertex-batch, bedrock-batch; the last two with a GCS emulator and moto's
S3 started in this process), checking the invariants after every step and draining at the end
(docs/simulation.md). `--route gateway` runs the gateway's simulation instead (tests/sim/gateway.py:
clients, flushes, crashes, restarts, a failing webhook receiver). Prints one line per seed and route, then the steps run, the seeds
and the violations, each with the shrunk sequence and the command that replays it. Exits 1
if any seed found a violation.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests package

from tests.sim import gateway  # noqa: E402
from tests.sim.machine import SimMachine, replay_command, run  # noqa: E402
from tests.sim.world import ROUTE_MODELS  # noqa: E402

ROUTES = list(ROUTE_MODELS)  # every batch route the simulation drives (tests/sim/world.py)
GATEWAY = "gateway"  # `lowtide gateway` in front of serve (tests/sim/gateway.py): asked for by name, not in "all"


def run_one(route: str, store_kind: str, **kw) -> None:
    if route == GATEWAY:
        gateway.run(store_kind, **kw)
    else:
        run(route, store_kind, **kw)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="steps per example, at most (default 40)")
    p.add_argument("--seeds", type=int, default=5, help="how many seeds (default 5)")
    p.add_argument("--seed", type=int, default=1, help="the first seed (default 1)")
    p.add_argument("--examples", type=int, default=3, help="examples per seed (default 3)")
    p.add_argument("--store", choices=["sqlite", "postgres", "both"], default="sqlite")
    p.add_argument("--route", choices=[*ROUTES, GATEWAY, "all"], default="all",
                   help="a route, `gateway` (the gateway's simulation), or all routes (default)")
    p.add_argument("--no-shrink", action="store_true", help="report the first failing sequence as found (faster)")
    return p


def _text(err: BaseException) -> str:
    notes = list(dict.fromkeys(getattr(err, "__notes__", [])))  # each once
    err.__notes__ = []
    return "".join(traceback.format_exception_only(err)) + "\n".join(notes)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    routes = ROUTES if args.route == "all" else [args.route]
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    violations = []
    started = time.monotonic()
    for seed in range(args.seed, args.seed + args.seeds):
        for store_kind in stores:
            for route in routes:
                t0 = time.monotonic()
                try:
                    run_one(route, store_kind, seed=seed, examples=args.examples, steps=args.steps, shrink=not args.no_shrink)
                    said = "ok"
                except Exception as err:
                    said = "VIOLATION"
                    # Several kinds found: Hypothesis raises them together, each shrunk apart.
                    for one in err.exceptions if isinstance(err, ExceptionGroup) else [err]:
                        violations.append((seed, store_kind, route, _text(one)))
                print(f"seed {seed:4d}  {store_kind:8s} {route:23s} {said:9s} {time.monotonic() - t0:7.1f} s", flush=True)
    print(f"\nsteps run: {SimMachine.steps_run + gateway.GatewayMachine.steps_run}   seeds: {args.seeds} (from {args.seed})   routes: {', '.join(routes)}   "
          f"stores: {', '.join(stores)}   violations: {len(violations)}   {time.monotonic() - started:.0f} s")  # fmt: skip
    for seed, store_kind, route, text in violations:
        print(f"\n--- seed {seed}, {store_kind}, {route}\n{text.strip()}")
        if "replay:" not in text:
            if route == GATEWAY:
                print(f"replay: {gateway.replay_command(store_kind, seed, args.examples, args.steps)}")
            else:
                print(f"replay: {replay_command(route, store_kind, seed, args.examples, args.steps)}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
