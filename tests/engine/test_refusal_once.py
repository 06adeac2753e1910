"""The loader asks a route about a job's fixed part once where the route says the rest of a
body decides its refusal (`rest_decides`: echo, for chat turns of text), and still asks about
every row whose turns are anything else. A refusal of the fixed part refuses every row."""

from __future__ import annotations

import json

import pytest

from lowtide.core.errors import SourceError
from lowtide.engine.loader import load_job
from lowtide.routes.own.echo import EchoRoute
from tests.conftest import make_spec, ticket_rows, write_csv


@pytest.fixture
def asked(monkeypatch) -> list[str]:
    """The rows' bodies echo's `refusal` is asked about (their last turns), in order; the real
    method answers. (A body without turns is the spec's own check, before any row.)"""
    seen: list[str] = []
    real = EchoRoute.refusal

    def counted(self, request):
        if request.body.get("messages"):
            seen.append(str(request.body["messages"][-1].get("content"))[:40])
        return real(self, request)

    monkeypatch.setattr(EchoRoute, "refusal", counted)
    return seen


def test_rows_that_differ_in_their_text_turns_alone_are_asked_about_once(sqlite_store, clock, tmp_path, asked):
    source = write_csv(tmp_path / "t.csv", ticket_rows(30))
    report = load_job(sqlite_store, make_spec(source), clock)
    assert report.new == 30
    assert len(asked) == 1  # the first row's body stands for all 30


def test_a_refused_fixed_part_refuses_every_row(sqlite_store, clock, tmp_path, asked):
    source = write_csv(tmp_path / "t.csv", ticket_rows(5))
    with pytest.raises(SourceError) as info:
        load_job(sqlite_store, make_spec(source, params={"logprobs": True}), clock)
    msg = str(info.value)
    assert "t.csv rows 1, 2, 3, 4, 5: logprobs: not honoured by this route" in msg
    assert len(asked) == 1


def test_a_row_whose_turns_hold_a_part_is_asked_about_after_rows_of_text(sqlite_store, clock, tmp_path, asked):
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    rows = [
        {"ticket_id": "a", "messages": [{"role": "user", "content": "hello a"}]},
        {"ticket_id": "b", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi b"}]},
        {"ticket_id": "c", "messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, image]}]},
        {"ticket_id": "d", "messages": [{"role": "user", "content": "hello d"}]},
    ]
    source = tmp_path / "chats.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = make_spec(source, template={"system": None, "user": None, "messages_column": "messages"})
    with pytest.raises(SourceError) as info:
        load_job(sqlite_store, spec, clock)
    msg = str(info.value)
    assert "1 problem(s)" in msg and "chats.jsonl row 3: messages[0].content[1]: content part 'image_url' is not taken" in msg
    assert len(asked) == 2  # the rows of text once, the row with an image on its own
