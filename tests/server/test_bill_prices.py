"""serve's bill prices each line as `pricing.attempt_cost` does at the batch tier: the bill
looks rates up once per model (engine/ledger.py) rather than the catalog once per line, and
must come to the same picodollars, an unknown model's cost staying unknown."""

from __future__ import annotations

from lowtide.core.pricing import attempt_cost
from lowtide.core.types import Usage
from lowtide.server import billing
from lowtide.store.money import to_pico
from tests.server.conftest import chat_line, create_batch, wait_openai


def test_each_billed_line_costs_what_attempt_cost_says_at_the_batch_tier(serve):
    with serve() as s:
        client = s.openai()
        priced = create_batch(client, [chat_line(f"p{i}", "word " * (i * 40 + 1), model="gpt-4o-mini") for i in range(4)])
        unknown = create_batch(client, [chat_line("u0", "hello", model="no-such-model")])
        for batch in (priced, unknown):
            assert wait_openai(client, batch.id).status == "completed"
    lines = billing.lines(s.server.store)
    assert sorted(b.custom_id for b in lines) == ["p0", "p1", "p2", "p3", "u0"]
    assert len({(b.input_tokens, b.output_tokens) for b in lines if b.model == "gpt-4o-mini"}) == 4  # four different prices
    for b in lines:
        usage = Usage(input_tokens=b.input_tokens, cached_input_tokens=b.cached_input_tokens, output_tokens=b.output_tokens)
        expected = to_pico(attempt_cost(usage, b.model, "openai-batch", at=b.at).usd)
        assert b.cost_picousd == expected, b
    assert next(b for b in lines if b.custom_id == "u0").cost_picousd is None
    assert all(b.cost_picousd > 0 for b in lines if b.model == "gpt-4o-mini")
