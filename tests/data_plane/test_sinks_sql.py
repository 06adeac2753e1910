"""`output.url` + `output.table`: results upserted into a real SQLite file and a real
PostgreSQL schema, from real jobs: typed columns, upsert by custom_id, one transaction,
idempotent; an existing table missing a column is refused before the run with its fix."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import sqlalchemy as sa

from lowtide.core.errors import LowtideError, SpecError
from lowtide.core.output_target import OutputTarget
from lowtide.engine.export import write_target
from lowtide.engine.preflight import check_target
from lowtide.engine.sql_sink import engine_for
from lowtide.store.db import Store
from tests.conftest import drive_to_end, make_spec, write_csv

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["billing", "technical"]},
        "confidence": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "detail": {"type": "object", "properties": {"urgent": {"type": "boolean"}, "count": {"type": "integer"}}},
    },
    "required": ["label", "confidence", "tags", "detail"],
}


def _rows(n: int = 6, bad: bool = False) -> list[dict]:
    rows = [
        {"ticket_id": f"T{1000 + i}", "body": f"ticket {i}", "n": str(i * 10), "score": f"{i}.5", "flag": "true" if i % 2 else "false",
         "opened": f"2026-03-0{i + 1}T08:30:00+00:00", "day": f"2026-03-0{i + 1}"}
        for i in range(n)
    ]  # fmt: skip
    if bad:
        rows[-1]["n"] = "lots"  # a declared int that is not one: the source is refused after the other rows
    return rows


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'warehouse.db'}"
    return request.getfixturevalue("pg_schema_url")


@pytest.fixture
def job(tmp_path, clock):
    write_csv(tmp_path / "tickets.csv", _rows())
    spec = make_spec(
        tmp_path / "tickets.csv", source={"types": {"n": "int", "opened": "timestamp", "day": "date"}},
        response_schema=SCHEMA, route_options={"reject": ["T1005"]},
    )  # fmt: skip
    store = Store(str(tmp_path / "lowtide.db"))
    drive_to_end(store, spec, clock)
    yield store, spec
    store.close()


def _read(url: str, table: str) -> tuple[dict[str, sa.types.TypeEngine], list[dict]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            t = sa.Table(table, sa.MetaData(), autoload_with=conn)
            rows = [dict(r._mapping) for r in conn.execute(sa.select(t).order_by(t.c.custom_id))]
            return {c.name: c.type for c in t.columns}, rows
    finally:
        engine.dispose()


def test_a_table_is_made_with_typed_columns_and_upserts_are_idempotent(job, db_url):
    store, spec = job
    table = f"results_{uuid.uuid4().hex[:6]}"
    target = OutputTarget("output.url", url=db_url, table=table)
    check_target(spec, target)  # the database answers; the table is made by the export
    report = write_target(store, "tickets", target)
    assert (report.rows, report.states) == (6, {"succeeded": 5, "failed": 1})
    types, rows = _read(db_url, table)
    kinds = {name: type(t).__name__.upper() for name, t in types.items()}
    assert kinds["n"] == "BIGINT" and kinds["input_tokens"] == "BIGINT"
    assert kinds["score"] in ("FLOAT", "DOUBLE_PRECISION", "DOUBLE") and kinds["confidence"] == kinds["score"]
    assert kinds["flag"] == "BOOLEAN" and kinds["source_changed"] == "BOOLEAN"
    assert kinds["opened"] in ("DATETIME", "TIMESTAMP") and kinds["day"] == "DATE"
    assert kinds["body"] == "TEXT" and kinds["label"] == "TEXT"
    assert kinds["tags"] in ("JSON", "JSONB") and kinds["detail"] == kinds["tags"] and kinds["tool_calls"] == kinds["tags"]
    first = rows[0]
    assert first["custom_id"] == "T1000" and first["state"] == "succeeded"
    assert first["n"] == 0 and first["score"] == 0.5 and first["flag"] is False and first["day"] == dt.date(2026, 3, 1)
    assert first["opened"].replace(tzinfo=None) == dt.datetime(2026, 3, 1, 8, 30)
    assert isinstance(first["tags"], list) and isinstance(first["detail"], dict) and first["label"] in ("billing", "technical")
    assert rows[5]["state"] == "failed" and rows[5]["label"] is None and rows[5]["error"].startswith("invalid_request")
    # A row changed by hand, and one the job does not have: the next export restores the
    # first and keeps the second (an upsert by custom_id, never a replace).
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {table} SET output = 'edited' WHERE custom_id = 'T1001'"))
        conn.execute(sa.text(f"INSERT INTO {table} (custom_id, state) VALUES ('other-job-row', 'succeeded')"))
    engine.dispose()
    again = write_target(store, "tickets", target)
    assert again.rows == 6
    _, after = _read(db_url, table)
    assert [r for r in after if r["custom_id"] != "other-job-row"] == rows
    assert [r["custom_id"] for r in after].count("other-job-row") == 1


def test_a_failure_mid_write_leaves_the_previous_rows(job, db_url, tmp_path):
    store, _ = job
    table = f"results_{uuid.uuid4().hex[:6]}"
    target = OutputTarget("output.url", url=db_url, table=table)
    write_target(store, "tickets", target)
    _, before = _read(db_url, table)
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {table} SET output = 'kept' WHERE custom_id = 'T1000'"))
    engine.dispose()
    write_csv(tmp_path / "tickets.csv", _rows(bad=True))  # rows 1-5 are upserted, then the source is refused
    with pytest.raises(LowtideError, match="lots"):
        write_target(store, "tickets", target)
    _, after = _read(db_url, table)
    assert after[0]["output"] == "kept"  # rolled back: the export's T1000 never landed
    assert [{**r, "output": None} for r in after] == [{**r, "output": None} for r in before]


def test_an_existing_table_missing_a_column_is_refused_before_the_run_with_the_statement_that_fixes_it(tmp_path, db_url):
    write_csv(tmp_path / "tickets.csv", _rows())
    spec = make_spec(tmp_path / "tickets.csv", source={"types": {"n": "int", "opened": "timestamp", "day": "date"}}, response_schema=SCHEMA)
    table = f"results_{uuid.uuid4().hex[:6]}"
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} (custom_id TEXT PRIMARY KEY, ticket_id TEXT, body TEXT, score FLOAT, flag BOOLEAN, "
                             "day DATE, opened TIMESTAMP WITH TIME ZONE, state TEXT, output TEXT, label TEXT, confidence FLOAT, tags JSON, detail JSON)"))  # fmt: skip
    target = OutputTarget("output.url", url=db_url, table=table)
    with pytest.raises(SpecError) as caught:
        check_target(spec, target)
    message = str(caught.value)
    assert message.startswith(f'output.table {table}: has no column "n", "error", "input_tokens"')
    fixes = message.split("add them: ", 1)[1]
    assert f"ALTER TABLE {table} ADD COLUMN n BIGINT" in fixes and f"ALTER TABLE {table} ADD COLUMN source_changed BOOLEAN" in fixes
    with engine.begin() as conn:  # the statements the message gives are the fix
        for statement in fixes.split("; "):
            conn.execute(sa.text(statement))
    engine.dispose()
    check_target(spec, target)


def test_an_existing_table_without_a_key_on_custom_id_is_refused(tmp_path, db_url):
    write_csv(tmp_path / "tickets.csv", _rows())
    spec = make_spec(tmp_path / "tickets.csv")
    table = f"results_{uuid.uuid4().hex[:6]}"
    columns = ", ".join(f"{c} TEXT" for c in ["ticket_id", "body", "n", "score", "flag", "opened", "day", "custom_id", "state", "output", "error",
                                              "input_tokens", "output_tokens", "attempts", "route", "source_changed", "finish_reason",
                                              "tool_calls", "refusal", "reasoning", "logprobs", "choices"])  # fmt: skip
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} ({columns})"))
    engine.dispose()
    with pytest.raises(SpecError, match=f'has no primary key or unique index on "custom_id".*CREATE UNIQUE INDEX ON {table} \\(custom_id\\)'):
        check_target(spec, OutputTarget("output.url", url=db_url, table=table))


@pytest.mark.postgres
def test_a_column_name_postgresql_would_cut_is_refused_before_the_run(tmp_path, pg_schema_url):
    """PostgreSQL keeps 63 bytes of a name. Two survey headers alike in their first 63 were
    one column: the run was paid for, then the upsert failed ("specified more than once").
    One long header made a table whose cut name never matched the results again, every
    later run refused with an ALTER TABLE that could not work."""
    ask = "How satisfied were you with the support you received from our team "
    write_csv(tmp_path / "tickets.csv", [{"ticket_id": "T1", "body": "hi", ask + "today?": "5", ask + "yesterday?": "3"}])
    spec = make_spec(tmp_path / "tickets.csv")
    with pytest.raises(SpecError, match=rf'output.table results: column "{ask}today\?" \(73 bytes\), "{ask}yesterday\?" \(77 bytes\): '
                                        "PostgreSQL keeps names of at most 63 bytes; rename them in the source"):  # fmt: skip
        check_target(spec, OutputTarget("output.url", url=pg_schema_url, table="results"))
    check_target(spec, OutputTarget("output.url", url=f"sqlite:///{tmp_path / 'r.db'}", table="results"))  # SQLite keeps them


def test_an_unreachable_database_is_refused_before_the_run(tmp_path):
    write_csv(tmp_path / "tickets.csv", _rows())
    spec = make_spec(tmp_path / "tickets.csv")
    target = OutputTarget("output.url", url="postgresql://nobody@127.0.0.1:1/none", table="results")
    with pytest.raises(SpecError, match=r"output.url postgresql://nobody@127.0.0.1:1/none: cannot connect .*PGPASSWORD"):
        check_target(spec, target)


@pytest.mark.parametrize("query", ["password=hunter2", "sslmode=require&sslpassword=hunter2"])
def test_an_output_url_with_a_password_as_a_query_parameter_is_refused_without_showing_it(tmp_path, query):
    """As `user:password@` is (the password would be stored with the spec, in the jobs table)."""
    write_csv(tmp_path / "tickets.csv", _rows())
    with pytest.raises(SpecError) as info:
        make_spec(tmp_path / "tickets.csv", output={"url": f"postgresql://etl@db.internal/warehouse?{query}", "table": "results"})
    msg = str(info.value)
    assert "holds a password; a spec never holds a key" in msg and "hunter2" not in msg


def test_a_sql_target_is_shown_without_a_password_in_any_form():
    target = OutputTarget("output.url", url="postgresql://etl@db.internal/warehouse?password=hunter2&sslmode=require", table="results")
    assert target.shown == "postgresql://etl@db.internal/warehouse?password=***&sslmode=require table results"
    with pytest.raises(SpecError) as info:  # the sink's own messages name the URL too
        engine_for("nodialect://etl@h/db?password=hunter2")
    assert "hunter2" not in str(info.value) and "nodialect://etl@h/db?password=***: cannot connect" in str(info.value)


def test_lowtide_run_upserts_into_a_specs_sql_table(tmp_path):
    from tests.cli.test_cli import Cli, write_job

    url = f"sqlite:///{tmp_path / 'warehouse.db'}"
    write_job(tmp_path, output={"url": url, "table": "ticket_results"})
    cli = Cli(tmp_path, str(tmp_path / "lowtide.db"))
    for _ in range(2):  # a second run adds nothing and changes nothing
        code, out = cli("run", "job.yaml")
        assert code == 0, out
        assert f"results: {url} table ticket_results (6 rows)" in out
        _, rows = _read(url, "ticket_results")
        assert [r["custom_id"] for r in rows] == [f"T{1000 + i}" for i in range(6)] and {r["state"] for r in rows} == {"succeeded"}


@pytest.mark.postgres
def test_an_existing_column_that_cannot_take_the_results_is_refused_before_the_run_with_its_fix(job, pg_schema_url):
    """PostgreSQL refuses a bigint into a TEXT column and a float into an INTEGER one: found
    before the run, not by the upsert after it."""
    store, spec = job
    table = f"results_{uuid.uuid4().hex[:6]}"
    engine = sa.create_engine(pg_schema_url)
    with engine.begin() as conn:
        conn.execute(sa.text(
            f"CREATE TABLE {table} (custom_id TEXT PRIMARY KEY, ticket_id TEXT, body TEXT, n NUMERIC, score FLOAT, flag BOOLEAN, "
            "opened TIMESTAMP WITH TIME ZONE, day DATE, state TEXT, output TEXT, error TEXT, label TEXT, confidence INTEGER, "
            "tags JSONB, detail JSONB, input_tokens BIGINT, output_tokens BIGINT, attempts TEXT, route TEXT, source_changed BOOLEAN, "
            "finish_reason TEXT, tool_calls JSONB, refusal TEXT, reasoning TEXT, logprobs JSONB, choices JSONB)"
        ))  # fmt: skip  (n NUMERIC takes the results' BIGINT: not refused)
    target = OutputTarget("output.url", url=pg_schema_url, table=table)
    with pytest.raises(SpecError) as caught:
        check_target(spec, target)
    message = str(caught.value)
    assert message.startswith(f'output.table {table}: column "confidence" is INTEGER but the results\' are FLOAT, '
                              '"attempts" is TEXT but the results\' are BIGINT; change them (')  # fmt: skip
    fixes = message.split("change them (", 1)[1].split("), or name a new table", 1)[0]
    with engine.begin() as conn:  # the statements the message gives are the fix
        for statement in fixes.split("; "):
            conn.execute(sa.text(statement))
    engine.dispose()
    check_target(spec, target)
    assert write_target(store, "tickets", target).rows == 6
    types, rows = _read(pg_schema_url, table)
    assert isinstance(types["attempts"], sa.BigInteger) and {r["attempts"] for r in rows} == {1}


def test_results_with_no_rows_still_make_their_table(tmp_path, db_url, clock):
    """A source emptied since the run (tonight's file, not there yet) joins no rows: the
    table is made all the same, so the step after the export finds it."""
    write_csv(tmp_path / "tickets.csv", _rows(2))
    spec = make_spec(tmp_path / "tickets.csv")
    table = f"results_{uuid.uuid4().hex[:6]}"
    with Store(str(tmp_path / "lowtide.db")) as store:
        drive_to_end(store, spec, clock)
        (tmp_path / "tickets.csv").write_text("ticket_id,body,n,score,flag,opened,day\n")
        report = write_target(store, "tickets", OutputTarget("output.url", url=db_url, table=table))
    assert (report.rows, report.states) == (0, {})
    types, rows = _read(db_url, table)
    assert rows == [] and {"custom_id", "ticket_id", "body", "state", "output"} <= set(types)


def test_an_answer_pruned_from_the_store_is_never_written_over_the_tables_copy(job, db_url, tmp_path, clock):
    """A finished job is pruned (its answers dropped), then its spec is run again for a new
    row: the table keeps the answers it has, the new row is added, and a table that never
    had the pruned rows gets them with state `pruned` and no answer (not `succeeded` and NULL)."""
    from lowtide.engine.retention import prune

    store, spec = job
    table = f"results_{uuid.uuid4().hex[:6]}"
    target = OutputTarget("output.url", url=db_url, table=table)
    write_target(store, "tickets", target)
    _, exported = _read(db_url, table)
    clock.advance(2 * 86400)
    assert prune(store, clock, 86400).requests == 5  # the failed row keeps its payload (and has no answer)
    write_csv(tmp_path / "tickets.csv", _rows(7))  # tonight's new row
    drive_to_end(store, spec, clock)

    report = write_target(store, "tickets", target)

    _, rows = _read(db_url, table)
    assert rows[:6] == exported  # answers, states and all, as the export before the prune wrote them
    assert (report.rows, report.states) == (7, {"pruned": 5, "failed": 1, "succeeded": 1})
    assert rows[6]["custom_id"] == "T1006" and rows[6]["state"] == "succeeded" and rows[6]["label"] in ("billing", "technical")
    fresh = f"results_{uuid.uuid4().hex[:6]}"
    write_target(store, "tickets", OutputTarget("output.url", url=db_url, table=fresh))
    _, new_rows = _read(db_url, fresh)
    assert [(r["state"], r["output"], r["label"]) for r in new_rows[:5]] == [("pruned", None, None)] * 5
    assert new_rows[0]["input_tokens"] == exported[0]["input_tokens"]  # what the store keeps is written


def test_a_decimal_keeps_its_digits_in_either_database(tmp_path, db_url, clock):
    """A Parquet decimal went into SQLite's NUMERIC as a float: 12345678901234567890.12 was
    stored as 1.2345678901234567e+19. SQLite keeps its digits as text; PostgreSQL a NUMERIC."""
    from decimal import Decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    amounts = [Decimal("12345678901234567890.12"), Decimal("-0.01"), None]
    pq.write_table(pa.table({"ticket_id": ["T1", "T2", "T3"], "body": ["a", "b", "c"], "amount": pa.array(amounts, pa.decimal128(22, 2))}),
                   tmp_path / "t.parquet")  # fmt: skip
    spec = make_spec(tmp_path / "t.parquet")
    store = Store(str(tmp_path / "lowtide.db"))
    drive_to_end(store, spec, clock)
    table = f"results_{uuid.uuid4().hex[:6]}"
    write_target(store, spec.name, OutputTarget("output.url", url=db_url, table=table))
    _, rows = _read(db_url, table)
    assert [None if r["amount"] is None else Decimal(r["amount"]) for r in rows] == amounts
    store.close()
