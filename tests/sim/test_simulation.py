"""The simulation in CI form: a fixed seed budget on every batch route and both stores
(the routes added later on SQLite only, with a smaller budget: CI is at its time budget).

Each case runs the examples drawn from its seed against the real engine and store, with
`lowtide serve` (echo backend) as the provider on a shared ManualClock (tests/sim). A
failure prints the shrunk sequence of steps and the one command that replays it; the long
form is `bench/simulate.py`.
"""

from __future__ import annotations

import pytest

from tests.sim.machine import run

ROUTES = ["openai-batch", "anthropic-batch", "gemini-batch", "echo-batch"]
SEED = 27
EXAMPLES = 8
STEPS = 40


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("store_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_simulation(store_kind, route, request):
    if store_kind == "postgres":
        request.getfixturevalue("pg_schema_url")  # skips (or fails in CI) without PostgreSQL
    run(route, store_kind, seed=SEED, examples=EXAMPLES, steps=STEPS)


# The batch routes added since, each on its own API at serve (tests/sim/world.py): SQLite only
# and a smaller budget; bench/simulate.py runs them longer and on PostgreSQL.
# vertex-batch and bedrock-batch bring their object store (GCS emulator, moto's S3: world.ObjectStores).
LATER_ROUTES = ["openai-compatible-batch", "azure-batch", "mistral-batch", "openrouter-batch", "vertex-batch", "bedrock-batch",
                "digitalocean-batch"]
LATER_EXAMPLES = 4
LATER_STEPS = 30


@pytest.mark.parametrize("route", LATER_ROUTES)
def test_simulation_later_routes(route):
    run(route, "sqlite", seed=SEED, examples=LATER_EXAMPLES, steps=LATER_STEPS)
