"""An increment source (`source.since`) that holds an id in several rows: a ticket as it came
one night and again, edited, on a later night. The newest row (highest `since` value) is the
request's: `--requeue-changed` re-runs a changed row though it is at the watermark, and the
results write each request once, beside its newest row (docs/data.md "Nightly increments")."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from lowtide.core.errors import SourceError
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.store.payloads import payload_text
from lowtide.store.schema import requests
from tests.conftest import drive_to_end, make_spec


def night(root, day: str, rows: list[tuple[str, str]]) -> None:
    folder = root / f"dt={day}"
    folder.mkdir(parents=True)
    (folder / "part.csv").write_text("ticket_id,body\n" + "".join(f"{i},{body}\n" for i, body in rows), encoding="utf-8")


def spec_for(root):
    return make_spec(root, source={"since": {"column": "dt"}}, template={"user": "{{ body }}"})


def results(store, tmp_path) -> dict[str, dict]:
    out = tmp_path / "out.jsonl"
    export_results(store, "tickets", out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    by_id = {r["custom_id"]: r for r in lines}
    assert len(by_id) == len(lines), [r["custom_id"] for r in lines]  # each request once
    return by_id


def test_requeue_changed_re_runs_a_changed_row_at_the_watermark(store, clock, tmp_path):
    root = tmp_path / "tickets"
    night(root, "2026-12-01", [("1", "first"), ("2", "second")])
    spec = spec_for(root)
    drive_to_end(store, spec, clock)
    night(root, "2026-12-02", [("2", "second EDITED"), ("3", "third")])

    report = load_job(store, spec, clock)  # the night's cron run: the change is reported, kept
    assert (report.new, report.changed, report.requeued, report.watermark) == (1, 1, 0, "2026-12-02")
    drive_to_end(store, spec, clock)
    kept = results(store, tmp_path)["2"]
    assert (kept["body"], kept["dt"], kept["output"], kept["source_changed"]) == ("second EDITED", "2026-12-02", "second", True)

    report = load_job(store, spec, clock, requeue_changed=True)  # as the message advises
    assert (report.new, report.changed, report.requeued, report.watermark) == (0, 1, 1, "2026-12-02")
    drive_to_end(store, spec, clock)
    rows = results(store, tmp_path)
    assert sorted(rows) == ["1", "2", "3"]
    again = rows["2"]
    assert (again["body"], again["output"], again["source_changed"], again["state"]) == ("second EDITED", "second EDITED", False, "succeeded")
    assert load_job(store, spec, clock).changed == 0  # the newest row is the one answered now


def test_a_first_load_stores_each_ids_newest_row_and_refuses_a_true_duplicate(store, clock, tmp_path):
    root = tmp_path / "tickets"
    night(root, "2026-12-01", [("1", "first"), ("2", "second")])
    night(root, "2026-12-02", [("2", "second EDITED")])
    report = load_job(store, spec_for(root), clock)
    assert (report.rows, report.new, report.watermark) == (2, 2, "2026-12-02")
    with store.read() as conn:
        stored = dict(conn.execute(sa.select(requests.c.custom_id, payload_text().label("payload"))).all())
    assert "second EDITED" in stored["2"]

    night(root, "2026-12-03", [("4", "fourth"), ("4", "fourth again")])  # one id twice in one night: no version is newer
    with pytest.raises(SourceError, match=r'dt=2026-12-03/part.csv line 2, dt=2026-12-03/part.csv line 3: duplicate id "4"'):
        load_job(store, spec_for(root), clock)
