"""serve embedded by a simulation (tests/sim): an injected clock, no worker thread (passes
run by `Worker.run_once`), a fault plan swapped while serving, a create whose answer is
lost (`after: true`), and the billing ledger (server/billing.py)."""

from __future__ import annotations

import json

import openai
import pytest

from lowtide.server import billing
from lowtide.server.faults import FaultPlan
from tests.server.conftest import chat_line, create_batch, file_lines, run_passes, stepped, upload


def _stepped(serve, **more):
    return stepped(serve, swappable_faults=True, **more)


def test_a_stepped_server_moves_only_when_stepped_and_on_its_clock(serve):
    with _stepped(serve) as s:
        client = s.openai()
        batch = create_batch(client, [chat_line(f"r{i}", f"hello {i}") for i in range(3)])
        assert batch.created_at == 1_900_000_000  # the injected clock's time
        assert client.batches.retrieve(batch.id).status == "validating"  # no worker thread moved it
        s.server.clock.clock.advance(60)
        run_passes(s)
        done = client.batches.retrieve(batch.id)
        assert done.status == "completed" and done.completed_at == 1_900_000_060
        lines = file_lines(client, done.output_file_id)
    bill = billing.lines(s.server.store, batch.id)
    assert sorted(b.custom_id for b in bill) == ["r0", "r1", "r2"]
    usage = {line["custom_id"]: line["response"]["body"]["usage"] for line in lines}
    assert all((b.input_tokens, b.output_tokens) == (usage[b.custom_id]["prompt_tokens"], usage[b.custom_id]["completion_tokens"])
               and b.whole and b.api == "openai" for b in bill)  # fmt: skip


def test_the_bill_books_a_line_written_twice_once_and_marks_a_cut_line(serve):
    with _stepped(serve) as s:
        s.server.faults.swap(FaultPlan.model_validate({"batches": [{"first": 1, "drop_lines": 1, "duplicate_lines": 1, "corrupt_lines": 1}]}))
        client = s.openai()
        batch = create_batch(client, [chat_line(f"r{i}", f"hello {i}") for i in range(4)])
        run_passes(s)
        assert client.batches.retrieve(batch.id).status == "completed"
    bill = {b.custom_id: b.whole for b in billing.lines(s.server.store, batch.id)}
    assert bill == {"r1": True, "r2": False, "r3": True}  # r0 dropped: not written, not billed


def test_a_swapped_plan_applies_from_the_next_call_and_a_lost_create_still_creates(serve):
    with _stepped(serve) as s:
        client = s.openai()
        file = upload(client, [chat_line("r0")])
        assert client.batches.list().data == []  # no fault yet
        s.server.faults.swap(FaultPlan.model_validate({"http": [{"match": "POST /v1/batches", "first": 1, "status": 500, "after": True}]}))
        with pytest.raises(openai.InternalServerError):
            client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"lowtide_key": "k1"})  # fmt: skip
        made = client.batches.list().data
        assert [json.dumps(b.metadata) for b in made] == ['{"lowtide_key": "k1"}']  # created; its answer was lost
        s.server.faults.swap(FaultPlan())
        assert client.batches.list().data[0].id == made[0].id


def test_after_needs_a_status():
    with pytest.raises(ValueError, match="after"):
        FaultPlan.model_validate({"http": [{"match": "*", "delay": 1, "after": True}]})
