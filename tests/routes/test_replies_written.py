"""An answer written as JSON text at once (`replies.chat_text_written`, echo's commonest: a
`WrittenOutcome`) is what writing its body gives, byte for byte: the text ingest stores as
`response` is `fastjson.dumps` of `reply_body`'s dict, its `plain_answer` the dict's
`plain_record`, and its `response`, read back where asked, the dict itself. Generated over
texts and models of every kind (quotes, control characters, non-ASCII, lone surrogates),
every finish, usage and service tier; and through the engine's own ingest."""

from __future__ import annotations

import random

import pytest
import sqlalchemy as sa
from hypothesis import event, given, settings
from hypothesis import strategies as st

from lowtide.core import fastjson
from lowtide.core.endpoints import CHAT
from lowtide.core.types import Outcome, Request, Usage, WrittenOutcome
from lowtide.engine.answer_columns import plain_chat_record, plain_record
from lowtide.routes import replies as _replies
from lowtide.routes.own import echo as _echo
from lowtide.routes.own.echo import EchoRoute
from lowtide.routes.replies import Reply, chat_finish, chat_text_written, reply_body
from lowtide.store.schema import requests
from tests.engine import answers as a
from tests.engine.ledger_helpers import dispatch, ingest

ODD = st.sampled_from(['"', "\\", "\n", "\x00", "\x1f", "\x7f", "é", "✓", "😀", "\u2028", "</script>"])
PLAIN = st.lists(st.one_of(st.text(max_size=8), ODD), max_size=6).map("".join)
LONE = st.sampled_from(["", "", "", "", "", "", "", "", "\ud800", "\udfff"])  # now and then one, which orjson refuses
TEXT = st.tuples(PLAIN, LONE, PLAIN).map("".join)
FINISH = st.sampled_from(["stop", "length", "tool_calls", "content_filter", "stop_sequence"])
COUNT = st.integers(0, 2**40)
USAGE = st.builds(Usage, COUNT, COUNT, COUNT, COUNT, COUNT)
TIER = st.sampled_from([None, None, None, None, None, "auto", "flex"])


class _Frozen:
    """Both ways write the answer at the same `created` second."""

    @staticmethod
    def time() -> float:
        return 1_700_000_000.0


@settings(max_examples=1000, deadline=None)
@given(custom_id=st.text(st.characters(codec="utf-8"), max_size=12), model=TEXT, text=TEXT, finish=FINISH, usage=USAGE, tier=TIER, route=st.sampled_from(["echo", "local"]))
def test_a_written_chat_answer_is_what_writing_its_body_gives(custom_id, model, text, finish, usage, tier, route):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]} | ({"service_tier": tier} if tier else {})
    request = Request(custom_id, CHAT, body)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_replies, "time", _Frozen)
        written = chat_text_written(request, route, text, finish, usage)
        made = reply_body(request, route, [Reply(text=text, finish=finish, output_tokens=usage.output_tokens)], usage)
    surrogate = any("\ud800" <= c <= "\udfff" for c in text + model)
    assert (written is None) == (tier is not None or surrogate)
    if written is None:
        event("left to the dicts")
        return
    assert written == fastjson.dumps(made)
    assert plain_chat_record(chat_finish(finish)) == plain_record(made)
    outcome = WrittenOutcome(custom_id, text, usage, finish, written, chat_finish(finish))
    assert outcome.response == made and outcome.response is outcome.response  # read once
    event("written")


def test_a_written_outcome_given_a_response_is_written_no_more():
    outcome = WrittenOutcome("a", "hi", Usage(), "stop", '{"x":1}', "stop")
    outcome.response = {"y": 2}
    assert outcome.written is None and outcome.response == {"y": 2}
    assert Outcome("b", True, response={"z": 3}).written is None


def test_ingest_stores_a_written_answer_as_it_stores_its_body(store, clock, tmp_path, monkeypatch):
    """The rows of echo's written answers hold what the same answers built as dicts give."""
    rng = random.Random(5)
    ids = [f"t{i:03}" for i in range(60)]
    job = a.loaded_job(store, clock, tmp_path, monkeypatch, ids)
    monkeypatch.setattr(_replies, "time", _Frozen)
    route, outcomes, expected = EchoRoute({}), [], {}
    for cid in ids:
        limit = rng.choice([None, 1, 3, 50])
        user = rng.choice(["billing ✓", 'a "quoted" \\ line\n' * 3, "", "x" * 40])
        body = {"model": "test-model", "messages": [{"role": "user", "content": user}]} | ({"max_tokens": limit} if limit else {})
        outcome = route.outcome(Request(cid, CHAT, body))
        assert isinstance(outcome, WrittenOutcome)
        with pytest.MonkeyPatch.context() as m:  # the same answer built as dicts
            m.setattr(_echo, "chat_text_written", lambda *_args: None)
            made = route.outcome(Request(cid, CHAT, body))
        assert made.written is None
        expected[cid] = (fastjson.dumps(made.response), plain_record(made.response), made.text)
        outcomes.append(outcome)
    counts = ingest(store, job, dispatch(store, job, job.spec.route, ids), job.spec.route, outcomes)
    assert counts.succeeded == len(ids)
    with store.begin() as conn:
        rows = conn.execute(sa.select(requests.c.custom_id, requests.c.response, requests.c.plain_answer, requests.c.output)).all()
    assert {cid: (response, plain, output) for cid, response, plain, output in rows} == expected
    assert {plain for _, _, plain, _ in rows} == {'"stop"', '"length"'}
