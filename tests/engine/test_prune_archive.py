"""`lowtide prune` with `--archive` (Parquet first, then drop), by each job's own `retention:`,
and `--vacuum` (store/space.py), on both backends."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from lowtide.core.errors import InputError, SpecError
from lowtide.core.spec import load_spec
from lowtide.engine.archive import archive_name
from lowtide.engine.control import job_status
from lowtide.engine.report import cost_report
from lowtide.engine.retention import PRUNED, prune
from lowtide.store.schema import attempts, jobs, request_versions, requests
from lowtide.store.space import reclaim, store_bytes
from tests.conftest import drive_to_end, make_spec, ticket_rows, whole_columns, write_csv
from tests.engine.test_delete_prune import _bodies, _spec, _with_a_version

DAY = 86400.0
BODIES = ("payload", "response", "repair", "output", "parsed", "plain_answer")


def _stored(store, name) -> list[dict]:
    """Every request row and earlier version of the job as the archive would show it, had
    all of it been dropped (the test then checks which parts were)."""
    with store.begin() as conn:
        job_id = conn.execute(sa.select(jobs.c.id).where(jobs.c.name == name)).scalar_one()
        r, v, a = requests.c, request_versions.c, attempts.c
        rows = []
        for row in conn.execute(sa.select(*whole_columns(requests)).where(r.job_id == job_id).order_by(r.id)).mappings():
            cost = conn.execute(sa.select(sa.func.sum(a.cost_picousd)).where(a.request_id == row["id"])).scalar()
            rows.append({"table": "requests", "row_id": row["id"], "request_id": row["id"], "custom_id": row["custom_id"],
                         "version": row["version"], "state": row["state"], **{b: row[b] for b in BODIES}, "cost_picousd": cost})  # fmt: skip
        for row in conn.execute(sa.select(*whole_columns(request_versions)).where(v.job_id == job_id).order_by(v.id)).mappings():
            cid = conn.execute(sa.select(r.custom_id).where(r.id == row["request_id"])).scalar_one()
            rows.append({"table": "request_versions", "row_id": row["id"], "request_id": row["request_id"], "custom_id": cid,
                         "version": row["version"], "state": row["state"], "payload": row["payload"], "response": row["response"],
                         "repair": None, "output": row["output"], "parsed": row["parsed"], "plain_answer": None, "cost_picousd": None})  # fmt: skip
        return rows


def test_archive_then_prune_writes_exactly_what_is_dropped(store, tmp_path, clock):
    _with_a_version(store, tmp_path, clock, "old")
    drive_to_end(store, _spec(tmp_path, "other"), clock)
    clock.advance(40 * DAY)
    before = _stored(store, "old")
    other = _stored(store, "other")
    report = cost_report(store).as_dict()
    assert any(row["table"] == "request_versions" for row in before) and all(row["output"] for row in before)

    done = prune(store, clock, 30 * DAY, archive=tmp_path / "archive")

    assert sorted(done.jobs) == ["old", "other"] and set(done.archives) == {"old", "other"}
    path = done.archives["old"]
    assert path == tmp_path / "archive" / archive_name("old", clock.now()) and path.exists()
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(p.name for p in done.archives.values())  # no .part left
    archived = pq.read_table(path).to_pylist()
    assert archived == before  # every row, every body, as stored: all of it was dropped
    assert pq.read_table(done.archives["other"]).to_pylist() == other
    # ... and what was archived is gone from the store, the ledger kept.
    assert all(row == (PRUNED, None, None, None) for row in _bodies(store, "old"))
    assert cost_report(store).as_dict() == report
    # Archiving again writes nothing: nothing is left to drop.
    assert prune(store, clock, 30 * DAY, archive=tmp_path / "again").jobs == []
    assert not (tmp_path / "again").exists()


def test_archive_under_keep_results_holds_no_answers_and_a_failed_request_keeps_its_payload(store, tmp_path, clock):
    rows = write_csv(tmp_path / "t.csv", ticket_rows(4))
    drive_to_end(store, make_spec(rows, name="mixed", route_options={"reject": ["T1001"]}), clock)
    assert job_status(store, "mixed").counts == {"succeeded": 3, "failed": 1}
    clock.advance(2 * DAY)
    before = {row["custom_id"]: row for row in _stored(store, "mixed")}

    done = prune(store, clock, DAY, keep_results=True, archive=tmp_path / "a")

    archived = {row["custom_id"]: row for row in pq.read_table(done.archives["mixed"]).to_pylist()}
    after = {row["custom_id"]: row for row in _stored(store, "mixed")}
    assert set(archived) == {cid for cid, row in before.items() if row["state"] == "succeeded" or row["response"]}
    for cid, row in archived.items():
        assert row["output"] is None and row["parsed"] is None and row["plain_answer"] is None  # kept in the store
        assert row["response"] == before[cid]["response"] and after[cid]["response"] is None
        assert row["payload"] == (before[cid]["payload"] if before[cid]["state"] == "succeeded" else None)
    for cid, row in after.items():
        assert row["output"] == before[cid]["output"]
        assert (row["payload"] == PRUNED) == (before[cid]["state"] == "succeeded")  # the failed one: retry sends it


def test_a_failing_archive_drops_nothing_and_names_the_directory_and_the_fix(store, tmp_path, clock):
    drive_to_end(store, _spec(tmp_path, "old"), clock)
    clock.advance(40 * DAY)
    bodies = _bodies(store, "old")
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the archive directory should be")

    with pytest.raises(InputError) as err:
        prune(store, clock, 30 * DAY, archive=blocked)

    message = str(err.value)
    assert str(blocked) in message and "nothing was pruned" in message and "directory you can write to" in message
    assert _bodies(store, "old") == bodies


def test_when_one_jobs_archive_fails_no_job_is_pruned_and_no_file_is_left(store, tmp_path, clock):
    drive_to_end(store, _spec(tmp_path, "first"), clock)
    drive_to_end(store, _spec(tmp_path, "second"), clock)
    clock.advance(40 * DAY)
    first, second = _bodies(store, "first"), _bodies(store, "second")
    folder = tmp_path / "archive"
    in_the_way = folder / f".{archive_name('second', clock.now())}.part"
    in_the_way.mkdir(parents=True)  # where the second file is written first

    with pytest.raises(InputError):
        prune(store, clock, 30 * DAY, archive=folder)

    assert _bodies(store, "first") == first and _bodies(store, "second") == second
    assert [p.name for p in folder.iterdir()] == [in_the_way.name]  # first's file removed


def test_a_second_archive_of_a_job_in_the_same_second_is_written_beside_the_first(store, tmp_path, clock):
    """Found by the simulation (docs/simulation.md finding 10): `prune --keep-results --archive
    DIR`, then `prune --archive DIR` in the same second (a script running both), was refused
    ("exists already"), telling the operator to give a directory they can write to."""
    drive_to_end(store, _spec(tmp_path, "old"), clock)
    clock.advance(40 * DAY)
    folder = tmp_path / "archive"
    first = prune(store, clock, 30 * DAY, keep_results=True, archive=folder).archives["old"]
    answers = [row for row in _stored(store, "old") if row["output"]]

    second = prune(store, clock, 30 * DAY, archive=folder).archives["old"]

    assert (first.name, second.name) == (archive_name("old", clock.now()), archive_name("old", clock.now(), 2))
    assert [row["output"] for row in pq.read_table(second).to_pylist()] == [row["output"] for row in answers]
    assert pq.read_table(first).num_rows and all(row[2] is None for row in _bodies(store, "old"))


def test_prune_without_older_than_follows_each_jobs_own_retention(store, tmp_path, clock):
    rows = write_csv(tmp_path / "t.csv", ticket_rows(4))
    specs = {
        "both": make_spec(rows, name="both", retention={"payloads": "1d", "results": "10d"}),
        "results": make_spec(rows, name="results", retention={"results": "3d"}),
        "none": make_spec(rows, name="none"),
    }
    for spec in specs.values():
        drive_to_end(store, spec, clock)
    report = cost_report(store).as_dict()
    answers = {name: [b[2] for b in _bodies(store, name)] for name in specs}

    clock.advance(2 * DAY)
    done = prune(store, clock)
    assert done.jobs == ["both"] and done.kept_results == ["both"]  # past payloads: 1d, not results: 10d
    assert [b[0] for b in _bodies(store, "both")] == [PRUNED] * 4 and [b[2] for b in _bodies(store, "both")] == answers["both"]

    clock.advance(2 * DAY)
    assert prune(store, clock).jobs == ["results"]  # 4 days: past results: 3d (everything goes)
    assert all(b == (PRUNED, None, None, None) for b in _bodies(store, "results"))

    clock.advance(7 * DAY)
    assert prune(store, clock).jobs == ["both"]  # 11 days: past results: 10d, the answers go too
    assert all(b == (PRUNED, None, None, None) for b in _bodies(store, "both"))
    assert [b[2] for b in _bodies(store, "none")] == answers["none"]  # no retention: left alone

    assert prune(store, clock, 5 * DAY).jobs == ["none"]  # --older-than: every job alike
    assert cost_report(store).as_dict() == report


@pytest.mark.parametrize(
    ("retention", "said"),
    [
        ("{payloads: 30x}", "`retention.payloads`: '30x' is not a duration"),
        ("{results: -5d}", "`retention.results`: '-5d' is not a duration above 0"),
        ("{payloads: 30d, results: 7d}", "raise `results` or lower `payloads`"),
        ("{}", "give `payloads`, `results` or both"),
        ("{payload: 30d}", "unknown key `retention.payload`"),
    ],
)
def test_a_bad_retention_is_refused_at_load_naming_file_field_and_fix(tmp_path, retention, said):
    rows = write_csv(tmp_path / "t.csv", ticket_rows(2))
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: j\nsource: {{path: {rows}, id_column: ticket_id}}\ntemplate: {{user: 'hi {{{{ body }}}}'}}\n"
        f"model: m\nroute: echo\nretention: {retention}\n",
        encoding="utf-8",
    )
    with pytest.raises(SpecError) as err:
        load_spec(path)
    message = str(err.value)
    assert str(path) in message and "line 6" in message and said in message, message
    if "duration" in said:
        assert "30d, 12h or 90m" in message


def test_vacuum_gives_back_what_a_prune_freed(store, tmp_path, clock):
    rows = [{**row, "body": row["body"] + " " + "padding " * 400} for row in ticket_rows(400)]
    write_csv(tmp_path / "big.csv", rows)
    spec = make_spec(tmp_path / "big.csv", name="big")
    drive_to_end(store, spec, clock)
    clock.advance(2 * DAY)
    before = store_bytes(store)
    assert prune(store, clock, DAY).jobs == ["big"]
    pruned = store_bytes(store)

    said = reclaim(store)

    after = store_bytes(store)
    if store.is_sqlite:
        assert said == "VACUUM"
        assert pruned >= before * 0.9  # the freed pages stay in the file until the VACUUM
        assert after < before / 3, (before, pruned, after)
    else:
        assert said.startswith("VACUUM (ANALYZE)")
        assert after <= pruned * 1.05  # reusable space, not a smaller file (its free-space map may add a page)
    assert job_status(store, "big").counts == {"succeeded": 400}


def test_a_job_that_changes_while_it_is_archived_is_left_alone(store, tmp_path, clock, monkeypatch):
    import lowtide.engine.retention as retention

    drive_to_end(store, _spec(tmp_path, "old"), clock)
    clock.advance(40 * DAY)
    bodies = _bodies(store, "old")
    write = retention.write_archives

    def and_a_retry_meanwhile(*args, **kwargs):
        written = write(*args, **kwargs)
        with store.begin() as conn:  # what `lowtide retry` does to the job row, as far as prune can tell
            conn.execute(sa.update(jobs).where(jobs.c.name == "old").values(updated_at=clock.now()))
        return written

    monkeypatch.setattr(retention, "write_archives", and_a_retry_meanwhile)
    done = prune(store, clock, 30 * DAY, archive=tmp_path / "a")

    assert done.jobs == [] and done.skipped == ["old"]
    assert _bodies(store, "old") == bodies
