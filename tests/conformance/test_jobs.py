"""A job spec says everything a request can say, and the route gets exactly that: no limit
or temperature invented, max_completion_tokens kept, an engine's own parameters passed to an
OpenAI-compatible server and carried by OpenAI's route too (not declared by the SDK: sent
as it came), refused by name where lowtide runs the body itself (echo)."""

from __future__ import annotations

import pytest

from lowtide.core.clock import ManualClock
from lowtide.core.errors import SourceError
from lowtide.engine.loader import load_job
from lowtide.store.db import Store
from tests.conformance.capture import capture
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv


def test_a_job_sends_its_params_as_they_are_and_nothing_else(tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    params = {"max_completion_tokens": 40, "seed": 7, "top_p": 0.9, "top_k": 20, "guided_json": {"type": "object"},
              "reasoning_effort": "low", "logprobs": True, "top_logprobs": 2}  # fmt: skip
    with capture() as cap:
        spec = make_spec(source, route="openai-compatible", route_options={"base_url": f"{cap.url}/v1"}, params=params)
        spec = spec.model_copy(update={"params": params})  # make_spec merges; this job sets exactly these
        status = drive_to_end(Store(str(tmp_path / "c.db")), spec, ManualClock(1_000_000.0))
        assert status.counts == {"succeeded": 3}
        bodies = [body for _, body in cap.seen.values()]
    assert len(bodies) == 3
    for body in bodies:
        assert set(body) == {"model", "messages", *params}  # no max_tokens, no temperature invented
        assert {k: body[k] for k in params} == params


def test_openai_carries_a_parameter_its_sdk_does_not_declare_and_echo_refuses_it_by_name(tmp_path, monkeypatch):
    # Issue 33 item 6: a same-protocol provider route sends an undeclared key as it came (the
    # SDKs' extra_body); a route that runs the body itself refuses it by name.
    monkeypatch.setenv("LOWTIDE_T_KEY", "sk-test-key-123")
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    with capture() as cap:
        spec = make_spec(source, route="openai", route_options={"api_key_env": "LOWTIDE_T_KEY", "base_url": f"{cap.url}/v1"},
                         params={"guided_json": {"type": "object"}})  # fmt: skip
        status = drive_to_end(Store(str(tmp_path / "c.db")), spec, ManualClock(1_000_000.0))
        assert status.counts == {"succeeded": 3}
        assert all(body["guided_json"] == {"type": "object"} for _, body in cap.seen.values())
    rows = write_csv(tmp_path / "b.csv", [{"ticket_id": "1", "body": '{"messages": [{"role": "user", "content": "hi"}], "guided_json": {}}'}])
    bodies = make_spec(rows, name="bodies", route="echo", template={"system": None, "user": None, "body_column": "body"})
    with pytest.raises(SourceError) as info:
        load_job(Store(str(tmp_path / "e.db")), bodies, ManualClock(0))
    said = str(info.value)
    assert "b.csv row 1: guided_json:" in said and "(route echo)" in said and "nothing was stored" in said
