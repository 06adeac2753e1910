"""`results` pages a batch's requests without their payloads when it knows the endpoint the
answers are written in, and reads the payload of exactly those whose stored answer is not
in that shape (built from the text, as `answer` does): the lines are the same as when every
payload is read, on SQLite and PostgreSQL, across more than one page."""

from __future__ import annotations

import sqlalchemy as sa

from lowtide.core import fastjson
from lowtide.core.endpoints import CHAT, MESSAGES
from lowtide.engine.loader import load_job
from lowtide.server import outputs
from lowtide.server.outputs import anthropic_line, openai_line, results
from lowtide.store.schema import requests
from tests.conftest import make_spec, ticket_rows, write_csv

CHAT_ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "x",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "kept", "refusal": None},
                            "finish_reason": "stop", "logprobs": None}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}  # fmt: skip
MESSAGE_ANSWER = {"id": "msg_1", "type": "message", "role": "assistant", "model": "x", "content": [{"type": "text", "text": "kept"}],
                  "stop_reason": "max_tokens", "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 64}}  # fmt: skip


def _settle(store, n: int) -> None:
    """Every request succeeded: a third with a chat completion kept, a third with an
    Anthropic message kept, a third with only the text (a row stored before answers were)."""
    with store.begin() as conn:
        ids = list(conn.scalars(sa.select(requests.c.id).order_by(requests.c.id)))
        assert len(ids) == n
        for i, request_id in enumerate(ids):
            kept = (CHAT_ANSWER, MESSAGE_ANSWER, None)[i % 3]
            conn.execute(
                sa.update(requests).where(requests.c.id == request_id).values(
                    state="succeeded", output=f"text {i}", response=None if kept is None else fastjson.dumps(kept),
                    input_tokens=3, output_tokens=64 if i % 2 else 1)
            )  # fmt: skip


def test_payloads_are_read_only_for_answers_built_from_text_and_the_lines_stay_the_same(store, clock, tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "PAGE", 7)  # several pages, one cut short
    n = 23
    load_job(store, make_spec(write_csv(tmp_path / "t.csv", ticket_rows(n)), params={"max_tokens": 64}), clock)
    _settle(store, n)
    jobs = [{"name": "tickets", "model": "asked-model"}]

    def lines(endpoint: str | None, as_messages: bool) -> list[str]:
        found = list(results(store, tmp_path, None, jobs, "completed", endpoint))
        assert len(found) == n
        if as_messages:
            return [anthropic_line("msgbatch_1", r) for r in found]
        return [openai_line("batch_1", r, 1_700_000_000, CHAT)[0] for r in found]

    read = []
    real_payloads = outputs._add_payloads

    def counting(conn, endpoint, page, found):
        real_payloads(conn, endpoint, page, found)
        read.extend(r.custom_id for r in found if r.payload is not None)

    monkeypatch.setattr(outputs, "_add_payloads", counting)
    for endpoint, as_messages, kept_in_shape in ((CHAT, False, 0), (MESSAGES, True, 1)):
        read.clear()
        assert lines(endpoint, as_messages) == lines(None, as_messages)
        # Only the answers not in the endpoint's shape had their payload read.
        assert len(read) == n - len(range(kept_in_shape, n, 3))
    built = [fastjson.loads(line) for line in lines(CHAT, False)][2::3]  # built from the text and the payload
    assert {b["response"]["body"]["choices"][0]["finish_reason"] for b in built} == {"stop", "length"}
