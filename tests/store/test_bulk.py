"""bulk.executemany on SQLite and PostgreSQL: rows given as dicts reach the table by position,
whatever order their keys come in, with the values a statement fixes and text the SQL would
otherwise treat as syntax (`%`, `?`, `:name`) kept exactly."""

from __future__ import annotations

import sqlalchemy as sa

from lowtide.store.bulk import executemany, fixed

scratch = sa.MetaData()
things = sa.Table(
    "bulk_things", scratch,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String, nullable=False),
    sa.Column("note", sa.Text),
    sa.Column("size", sa.Integer),
    sa.Column("state", sa.String, nullable=False),
)  # fmt: skip

AWKWARD = ["50% off", "why?", ":name and %(name)s", "%s %%", "ünïcode ☃", "", None]


def _table(store):
    with store.begin() as conn:
        scratch.drop_all(conn)
        scratch.create_all(conn)


def _all(store) -> list[tuple]:
    with store.read() as conn:
        return [tuple(r) for r in conn.execute(sa.select(things).order_by(things.c.id))]


def test_an_insert_takes_its_columns_from_the_rows_in_any_key_order(store):
    _table(store)
    rows = [{"name": f"n{i}", "note": note, "size": i, "state": "new"} for i, note in enumerate(AWKWARD)]
    rows[1] = {"state": "new", "size": 1, "note": AWKWARD[1], "name": "n1"}  # keys in another order
    with store.begin() as conn:
        executemany(conn, things.insert(), rows)
    assert _all(store) == [(i + 1, f"n{i}", note, i, "new") for i, note in enumerate(AWKWARD)]


def test_an_update_binds_a_repeated_name_and_keeps_the_values_the_statement_fixes(store):
    _table(store)
    with store.begin() as conn:
        executemany(conn, things.insert(), [{"name": f"n{i}", "note": None, "size": 0, "state": "new"} for i in range(4)])
        stmt = (
            sa.update(things)
            .where(things.c.id == sa.bindparam("_id"), things.c.state == "new")  # a bound constant
            .values(note=sa.bindparam("text"), name=sa.bindparam("text"), size=fixed(conn, 7), state="done")
        )
        executemany(conn, stmt, [{"_id": 1, "text": "50% off"}, {"text": ":name?", "_id": 3}])
        executemany(conn, stmt, [{"_id": 1, "text": "not again: already done"}])  # the WHERE still guards
    assert _all(store) == [
        (1, "50% off", "50% off", 7, "done"),
        (2, "n1", None, 0, "new"),
        (3, ":name?", ":name?", 7, "done"),
        (4, "n3", None, 0, "new"),
    ]


def test_a_statement_with_one_parameter_binds_it_per_row(store):
    _table(store)
    with store.begin() as conn:
        executemany(conn, things.insert(), [{"name": f"n{i}", "note": None, "size": 0, "state": "new"} for i in range(3)])
        executemany(conn, sa.delete(things).where(things.c.id == sa.bindparam("_id")), [{"_id": 1}, {"_id": 3}])
    assert [r[0] for r in _all(store)] == [2]
