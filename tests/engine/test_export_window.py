"""The export reads a chunk's stored requests as the job's next ones in id order (a window,
export.py `_window_read`) before looking the rest up by custom_id: whatever the source's
order, and whatever rows it gained or lost since the load, every file is byte for byte what
the lookup by custom_id alone writes. Beside the job, another of the same ids, stored right
after it in the other order: a window that ran past the job's requests into its rows would
take their answers."""

from __future__ import annotations

import functools
import json
import random

import pytest
import sqlalchemy as sa

from lowtide.core.ids import custom_id_of, legacy_custom_ids
from lowtide.core.sources import Source
from lowtide.engine import export
from lowtide.engine.export import ResultRows, export_results
from lowtide.store.schema import jobs, requests
from tests.conftest import drive_to_end, make_spec, write_csv

CHUNK = 40  # source rows a chunk (5,000 in use): a few hundred rows make several windows
N = 300


@pytest.fixture
def small_chunks(monkeypatch):
    size, strict = Source.chunks.__defaults__
    monkeypatch.setattr(Source.chunks, "__defaults__", (CHUNK, strict))


@pytest.fixture
def windows(monkeypatch):
    """Each window read: (ids asked, ids it found, whether the pass reads windows after it)."""
    seen: list[tuple[int, int, bool]] = []
    read = ResultRows._window_read

    def spy(self, conn, ids, window):
        found = read(self, conn, ids, window)
        seen.append((len(ids), len(found), window.on))
        return found

    monkeypatch.setattr(ResultRows, "_window_read", spy)
    return seen


def _rows() -> list[dict]:
    # "T 7": a key mapped to a custom_id, which has a legacy one (core/ids.py)
    return [{"ticket_id": f"T {i}" if i % 2 else f"T{i}", "body": f"ticket {i}"} for i in range(N)]


@pytest.fixture
def job(store, tmp_path, clock, small_chunks):
    rows = _rows()
    source = write_csv(tmp_path / "tickets.csv", rows)
    drive_to_end(store, make_spec(source), clock)
    other = write_csv(tmp_path / "other.csv", rows[::-1])
    drive_to_end(store, make_spec(other, name="other", template={"user": "Other: {{ body }}"}), clock)
    with store.engine.begin() as conn:  # requests stored under their legacy custom_ids
        job_id = conn.execute(sa.select(jobs.c.id).where(jobs.c.name == "tickets")).scalar()
        for row in rows[1:N:22]:
            key = row["ticket_id"]
            conn.execute(
                sa.update(requests)
                .where(requests.c.job_id == job_id, requests.c.custom_id == custom_id_of(key))
                .values(custom_id=legacy_custom_ids(key)[0])
            )
    return store, source, rows


def _exports(store, tmp_path, monkeypatch, name: str) -> None:
    """The job's results with windows, then by custom_id alone: the same bytes."""
    for full in (False, True):
        export_results(store, "tickets", tmp_path / f"{name}.jsonl", full=full)
        with monkeypatch.context() as m:
            m.setattr(export, "_Window", functools.partial(export._Window, on=False))
            export_results(store, "tickets", tmp_path / f"{name}.probed.jsonl", full=full)
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (tmp_path / f"{name}.probed.jsonl").read_bytes()


def _outputs(tmp_path, name: str) -> dict[str, tuple]:
    lines = (tmp_path / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["ticket_id"]: (r["state"], r.get("output")) for r in map(json.loads, lines)}  # a row not loaded has no output


def test_a_source_in_load_order_is_read_by_windows(job, tmp_path, monkeypatch, windows):
    store, source, rows = job
    _exports(store, tmp_path, monkeypatch, "same")
    asked = windows[: len(windows) // 2]  # the first export's (the probed ones read none)
    assert len(asked) == N // CHUNK + 1 and all(on for _, _, on in asked)
    assert sum(found for _, found, _ in asked) == N - len(range(1, N, 22))  # all but the legacy ids
    assert _outputs(tmp_path, "same") == {r["ticket_id"]: ("succeeded", f"Ticket: {r['body']}") for r in rows}


def test_rows_gone_and_rows_added_export_as_by_custom_id(job, tmp_path, monkeypatch, windows):
    store, source, rows = job
    kept = rows[:50] + rows[70:]
    # not loaded: the first window has no request to start at; the last runs past the job's requests
    added = [{"ticket_id": f"N{i}", "body": f"new {i}"} for i in range(35)]
    write_csv(source, added[:5] + kept + added[5:])
    _exports(store, tmp_path, monkeypatch, "edited")
    assert windows and all(on for _, _, on in windows)
    expected = {r["ticket_id"]: ("succeeded", f"Ticket: {r['body']}") for r in kept} | {r["ticket_id"]: ("not_loaded", None) for r in added}
    assert _outputs(tmp_path, "edited") == expected


@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_a_source_in_another_order_stops_reading_windows(job, tmp_path, monkeypatch, windows, order):
    store, source, rows = job
    moved = rows[::-1] if order == "reversed" else random.Random(3).sample(rows, len(rows))
    write_csv(source, moved)
    _exports(store, tmp_path, monkeypatch, order)
    first = windows[: len(windows) // 2]
    assert [on for _, _, on in first] == [True, False]  # two windows in a row, not the chunk's: no more
    assert _outputs(tmp_path, order) == {r["ticket_id"]: ("succeeded", f"Ticket: {r['body']}") for r in rows}
