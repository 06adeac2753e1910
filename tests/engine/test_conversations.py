"""Rows that already are conversations (template.messages_column)."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from lowtide.core.errors import SourceError
from lowtide.engine.loader import load_job
from lowtide.store.schema import requests
from tests.conftest import drive_to_end, make_spec, whole_columns


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rows_with_their_own_messages_and_parameters_run_as_they_are(sqlite_store, clock, tmp_path):
    source = _jsonl(
        tmp_path / "chats.jsonl",
        [
            {"ticket_id": "a", "messages": [{"role": "user", "content": "hello a"}]},
            {"ticket_id": "b", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi b"}], "max_tokens": 7},
        ],
    )
    spec = make_spec(source, template={"system": None, "user": None, "messages_column": "messages"})
    status = drive_to_end(sqlite_store, spec, clock)
    assert status.counts == {"succeeded": 2}
    with sqlite_store.begin() as conn:
        rows = {r.custom_id: r for r in conn.execute(sa.select(*whole_columns(requests)))}
    assert rows["a"].output == "hello a"
    assert json.loads(rows["b"].payload)["body"]["max_tokens"] == 7
    assert json.loads(rows["a"].payload)["body"]["max_tokens"] == 256


def test_a_malformed_conversation_names_the_row_and_the_column(sqlite_store, clock, tmp_path):
    source = _jsonl(tmp_path / "chats.jsonl", [{"ticket_id": "a", "messages": [{"role": "robot", "content": "x"}]}])
    spec = make_spec(source, template={"system": None, "user": None, "messages_column": "messages"})
    with pytest.raises(SourceError, match=r"chats.jsonl row 1: column \"messages\" message 1 \(messages\[0\].role\): 'robot' is not one of assistant, developer"):
        load_job(sqlite_store, spec, clock)
