"""The simulation in CI form for the batch routes added since the first four (each on its own
API at serve, tests/sim/world.py): SQLite only and a smaller budget, CI being at its time
budget; bench/simulate.py runs them longer and on PostgreSQL. vertex-batch and bedrock-batch
bring their object store (GCS emulator, moto's S3: world.ObjectStores). A file apart from
test_simulation.py so that CI's `--dist loadfile` runs the two on two workers."""

from __future__ import annotations

import pytest

from tests.sim.machine import run
from tests.sim.test_simulation import SEED

LATER_ROUTES = ["openai-compatible-batch", "azure-batch", "mistral-batch", "openrouter-batch", "vertex-batch", "bedrock-batch",
                "digitalocean-batch"]
LATER_EXAMPLES = 4
LATER_STEPS = 30


@pytest.mark.parametrize("route", LATER_ROUTES)
def test_simulation_later_routes(route):
    run(route, "sqlite", seed=SEED, examples=LATER_EXAMPLES, steps=LATER_STEPS)
