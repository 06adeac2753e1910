"""The simulation in CI form: a fixed seed budget on the first four batch routes, the echo
direct route, and both stores (the routes added later: test_simulation_later.py, a file of its own so that CI's
`--dist loadfile` runs the two on two workers).

Each case runs the examples drawn from its seed against the real engine and store, with
`lowtide serve` (echo backend) as the provider on a shared ManualClock (tests/sim). A
failure prints the shrunk sequence of steps and the one command that replays it; the long
form is `bench/simulate.py`.
"""

from __future__ import annotations

import pytest

from tests.sim.machine import run

ROUTES = ["openai-batch", "anthropic-batch", "gemini-batch", "echo-batch", "echo"]  # echo: a direct route
SEED = 27
EXAMPLES = 6  # 8 until CI reached 26 min; each step costs more since the fallback, delete and auto steps
STEPS = 40


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("store_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_simulation(store_kind, route, request):
    if store_kind == "postgres":
        request.getfixturevalue("pg_schema_url")  # skips (or fails in CI) without PostgreSQL
    run(route, store_kind, seed=SEED, examples=EXAMPLES, steps=STEPS)
