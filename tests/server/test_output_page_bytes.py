"""`results` reads a batch's rows in pages of about PAGE_BYTES of what they kept, not of
PAGE rows whatever their size: 50,000 embedding answers of 16 kB each were read 5,000 at a
time (82 MB of text, twice that parsed) and serve's peak RSS grew with them
(bench/maxsize.py, embeddings-result). Checked by what is read ahead of what is written."""

from __future__ import annotations

import sqlalchemy as sa

from lowtide.core import fastjson
from lowtide.core.endpoints import CHAT
from lowtide.engine.loader import load_job
from lowtide.server import outputs
from lowtide.server.outputs import openai_line, results
from lowtide.store.schema import requests
from tests.conftest import make_spec, ticket_rows, write_csv

ANSWER_CHARS = 100_000
PAGE_BYTES = 1_000_000


def _answer(i: int) -> str:
    return fastjson.dumps({
        "id": f"chatcmpl-{i}", "object": "chat.completion", "created": 1, "model": "x",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f"{i} " + "v" * ANSWER_CHARS},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    })  # fmt: skip


def test_big_answers_are_read_a_few_at_a_time_and_every_line_comes_out(store, clock, tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "PAGE_BYTES", PAGE_BYTES, raising=False)  # (raising: the check fails, not the setup, before the fix)
    n = 60  # 6 MB of answers
    load_job(store, make_spec(write_csv(tmp_path / "t.csv", ticket_rows(n))), clock)
    with store.begin() as conn:
        for i, request_id in enumerate(conn.scalars(sa.select(requests.c.id).order_by(requests.c.id))):
            conn.execute(sa.update(requests).where(requests.c.id == request_id).values(
                state="succeeded", output="", response=_answer(i), input_tokens=3, output_tokens=1))  # fmt: skip

    made = 0
    real = outputs._result

    def counted(*args, **kwargs):
        nonlocal made
        made += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(outputs, "_result", counted)
    ahead = []
    lines = []
    for given, r in enumerate(results(store, tmp_path, None, [{"name": "tickets", "model": "m"}], "completed", CHAT)):
        ahead.append(made - given)  # results read and not yet written, this one included
        lines.append(openai_line("batch_1", r, 1, CHAT)[0])
    # Never more than about two pages' worth held (a page is sized from the one before).
    assert max(ahead) * ANSWER_CHARS <= 2 * PAGE_BYTES, ahead
    assert [fastjson.loads(line)["response"]["body"]["choices"][0]["message"]["content"].split()[0] for line in lines] == [
        str(i) for i in range(n)
    ]


def test_a_page_holds_about_page_bytes_between_one_row_and_page_rows():
    assert outputs.next_page_size(held=outputs.PAGE_BYTES * 4, rows=400) == 100
    assert outputs.next_page_size(held=10, rows=16) == outputs.PAGE
    assert outputs.next_page_size(held=outputs.PAGE_BYTES * 100, rows=1) == 1
    assert outputs.next_page_size(held=0, rows=16) == outputs.PAGE
