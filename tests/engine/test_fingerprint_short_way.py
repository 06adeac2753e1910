"""A row's fingerprint (engine/loader.py `RowRenderer.fingerprint`) takes its used values by
one itemgetter where the row has them all, and reads a column the row leaves out as None;
`fingerprints` hashes many rows in one loop (the export's). All ways give the fingerprint the documented long way gives (a keyed BLAKE2b of the used
values' JSON), so stored fingerprints stay comparable across lowtide versions."""

from __future__ import annotations

import hashlib

import pytest

from lowtide.engine.loader import RowRenderer, _canonical, check_job
from tests.conftest import make_spec, write_csv


def long_way(render: RowRenderer, values: dict) -> str:
    used = [values.get(k) for k in render.used]
    return hashlib.blake2b(_canonical(used), digest_size=16, key=render.fp_key).hexdigest()


@pytest.mark.parametrize(
    "user", ["Ticket: {{ body }}", "{{ channel }}: {{ body }}", "Fixed text", "{{ channel }} {{ body }} {{ n }}"]
)
def test_the_short_way_is_the_long_way(tmp_path, user):
    source = write_csv(tmp_path / "t.csv", [{"ticket_id": "A", "channel": "email", "body": "x", "n": "3"}])
    spec = make_spec(source, template={"user": user}, source={"optional_columns": ["n"]})
    template, src = check_job(spec)
    render = RowRenderer(spec, template, src)
    rows = [
        {"ticket_id": "A", "channel": "email", "body": "x", "n": "3"},
        {"ticket_id": "A", "channel": "chat", "body": "y\u00e9 \"q\"", "n": None},
        {"ticket_id": "A", "body": "x"},  # a JSONL row that leaves columns out
        {"ticket_id": "A", "channel": 7, "body": 2**70, "n": 1.5},  # beyond orjson: json's text
    ]
    for values in rows:
        assert render.fingerprint(values) == long_way(render, values)
    assert render.fingerprints(rows) == [long_way(render, values) for values in rows]
    assert render.fingerprint(rows[2]) == render.fingerprint(rows[2] | {"channel": None, "n": None})
