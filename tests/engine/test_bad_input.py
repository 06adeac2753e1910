"""DESIGN invariant 7: bad input is refused before anything is submitted, with a message that
names the file, the row, the field and the fix; and nothing already in the store changes.

The "nothing changes" tests first run a good job to the end, snapshot every row of the
store's tables, then make a bad load of the *same* job raise and compare the snapshot.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from lowtide.core.errors import (
    InputError,
    SourceError,
    SpecError,
    TemplateError,
    UnknownRouteError,
)
from lowtide.core.ids import custom_id_for
from lowtide.core.spec import JobSpec, load_spec
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.routes import known_routes
from lowtide.store.payloads import payload_text
from lowtide.store.schema import attempts, dispatches, events, jobs, requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv

COLUMNS = ["ticket_id", "channel", "body", "gold"]
TABLES = (jobs, requests, attempts, dispatches, events)


def spec_for(path: Path, /, **overrides: Any) -> JobSpec:
    return make_spec(path, **overrides)


def snapshot(store) -> dict[str, list[tuple]]:
    with store.begin() as conn:
        return {t.name: [tuple(r) for r in conn.execute(sa.select(t).order_by(t.c.id))] for t in TABLES}


@pytest.fixture
def finished(store, clock, tmp_path):
    """A store holding one finished job "tickets" (10 rows of t.csv); returns its snapshot."""
    source = write_csv(tmp_path / "t.csv", ticket_rows(10))
    status = drive_to_end(store, spec_for(source), clock)
    assert status.counts == {"succeeded": 10}
    before = snapshot(store)
    assert len(before["requests"]) == 10 and len(before["attempts"]) == 10
    return before


def refused(store, spec: JobSpec, clock, error: type[Exception] = InputError) -> Exception:
    with pytest.raises(error) as info:
        load_job(store, spec, clock)
    return info.value


# 1. unreadable files --------------------------------------------------------------------


def test_missing_source_file_is_refused_and_store_unchanged(store, clock, tmp_path, finished):
    err = refused(store, spec_for(tmp_path / "nope.csv"), clock, SourceError)
    msg = str(err)
    assert "nope.csv" in msg and "no such file" in msg and "source.path" in msg
    assert snapshot(store) == finished


def test_directory_as_source_is_refused(sqlite_store, clock, tmp_path):
    (tmp_path / "data.csv").mkdir()
    msg = str(refused(sqlite_store, spec_for(tmp_path / "data.csv"), clock, SourceError))
    assert "data.csv" in msg and "an empty folder" in msg and "source.path" in msg


def test_non_utf8_csv_is_refused_with_the_byte_and_the_fix(store, clock, tmp_path, finished):
    data = b"ticket_id,channel,body,gold\nT1000,email,fine,billing\nT1001,email,caf\xe9,billing\n"
    (tmp_path / "t.csv").write_bytes(data)  # the good job's own file, now in Latin-1
    err = refused(store, spec_for(tmp_path / "t.csv"), clock, SourceError)
    msg = str(err)
    assert "t.csv" in msg and "not UTF-8" in msg and "save the file as UTF-8" in msg
    assert "t.csv line 3, column 16" in msg  # the é of "café"
    assert snapshot(store) == finished


def test_non_utf8_byte_deep_in_a_large_csv_is_located_correctly(sqlite_store, clock, tmp_path):
    rows = "".join(f"T{i},email,{'x' * 50},billing\n" for i in range(400))
    data = f"ticket_id,channel,body,gold\n{rows}".encode() + b"T9999,email,caf\xe9,billing\n"
    (tmp_path / "t.csv").write_bytes(data)
    msg = str(refused(sqlite_store, spec_for(tmp_path / "t.csv"), clock, SourceError))
    # The decoder reads in blocks: its own offset would point into the block, not the file.
    assert "t.csv line 402, column 16: not UTF-8 text; save the file as UTF-8" in msg


# 2. unknown extension -------------------------------------------------------------------


def test_unknown_source_extension_lists_the_known_ones(store, clock, tmp_path, finished):
    (tmp_path / "tickets.xlsx").write_bytes(b"PK\x03\x04 not really a workbook")
    err = refused(store, spec_for(tmp_path / "tickets.xlsx"), clock, SpecError)
    msg = str(err)
    assert "tickets.xlsx" in msg and '".xlsx"' in msg
    assert ".csv, .jsonl, .ndjson, .parquet" in msg and "format" in msg
    assert snapshot(store) == finished


# 3. id column ---------------------------------------------------------------------------


def test_missing_id_column_lists_the_columns(store, clock, tmp_path, finished):
    rows = [{"id": r["ticket_id"], "channel": r["channel"], "body": r["body"]} for r in ticket_rows(10)]
    write_csv(tmp_path / "t.csv", rows)
    msg = str(refused(store, spec_for(tmp_path / "t.csv"), clock, SourceError))
    assert 'no column "ticket_id"' in msg and "source.id_column" in msg
    assert "columns are: id, channel, body" in msg
    assert snapshot(store) == finished


def test_empty_ids_report_every_offending_row(store, clock, tmp_path, finished):
    rows = ticket_rows(12)  # rows 1-10 are the stored ones; 11 and 12 would be new
    rows[1]["ticket_id"] = ""
    rows[4]["ticket_id"] = "   "
    write_csv(tmp_path / "t.csv", rows)
    err = refused(store, spec_for(tmp_path / "t.csv"), clock, SourceError)
    assert len(err.problems) == 2
    msg = str(err)
    assert "refused, nothing was stored" in msg and "2 problem(s)" in msg
    assert 't.csv row 2 (line 3): id column "ticket_id" is empty' in msg
    assert 't.csv row 5 (line 6): id column "ticket_id" is empty' in msg
    assert "every row needs a unique id (source.id_column)" in msg
    assert snapshot(store) == finished


def test_duplicate_ids_report_every_row_that_shares_one(store, clock, tmp_path, finished):
    rows = ticket_rows(12)
    rows[3]["ticket_id"] = rows[6]["ticket_id"] = rows[0]["ticket_id"]  # rows 1, 4, 7
    rows[9]["ticket_id"] = rows[10]["ticket_id"]  # rows 10, 11
    write_csv(tmp_path / "t.csv", rows)
    err = refused(store, spec_for(tmp_path / "t.csv"), clock, SourceError)
    assert len(err.problems) == 2
    msg = str(err)
    assert 't.csv rows 1, 4, 7: duplicate id "T1000" in column "ticket_id"' in msg
    assert 't.csv rows 10, 11: duplicate id "T1010" in column "ticket_id"' in msg
    assert "ids must be unique" in msg
    assert snapshot(store) == finished


def test_duplicates_in_a_folder_name_each_file_and_line(sqlite_store, clock, tmp_path):
    """In a source of many files a repeat is found by its file and line: the message named
    only the folder and row numbers counted over every file read."""
    rows = ticket_rows(4)
    (tmp_path / "t" / "dt=2026-12-02").mkdir(parents=True)
    (tmp_path / "t" / "dt=2026-12-03").mkdir()
    write_csv(tmp_path / "t" / "dt=2026-12-02" / "part.csv", rows[:3])
    write_csv(tmp_path / "t" / "dt=2026-12-03" / "part.csv", [rows[3] | {"ticket_id": rows[1]["ticket_id"]}])
    msg = str(refused(sqlite_store, spec_for(tmp_path / "t"), clock, SourceError))
    assert (f'dt=2026-12-02/part.csv line 3, dt=2026-12-03/part.csv line 2: duplicate id "{rows[1]["ticket_id"]}"'
            ' in column "ticket_id"') in msg  # fmt: skip


def test_duplicates_after_trimming_are_duplicates(sqlite_store, clock, tmp_path):
    rows = ticket_rows(3)
    rows[2]["ticket_id"] = f" {rows[0]['ticket_id']} "
    write_csv(tmp_path / "t.csv", rows)
    msg = str(refused(sqlite_store, spec_for(tmp_path / "t.csv"), clock, SourceError))
    assert 'rows 1, 3: duplicate id "T1000"' in msg


# 6. ids that are not valid custom_ids ---------------------------------------------------

ODD_KEYS = [
    "ticket 48213",
    "#42",
    "café #12",
    "日本語",
    "a/b\\c",
    "x" * 70,
    "y" * 64,  # valid as it is: the longest allowed
    "T-1_ok",  # valid as it is
]


def test_odd_ids_are_mapped_and_the_original_key_is_kept(store, clock, tmp_path):
    rows = [{"ticket_id": k, "channel": "web", "body": f"body {i}", "gold": "billing"} for i, k in enumerate(ODD_KEYS)]
    source = write_csv(tmp_path / "t.csv", rows)
    status = drive_to_end(store, spec_for(source), clock)
    assert status.counts == {"succeeded": len(ODD_KEYS)}

    with store.begin() as conn:
        stored = dict(conn.execute(sa.select(requests.c.source_key, requests.c.custom_id)).all())
    assert set(stored) == set(ODD_KEYS)
    assert len(set(stored.values())) == len(ODD_KEYS)
    for key, cid in stored.items():
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", cid), cid
        assert cid == custom_id_for(key)
    assert stored["T-1_ok"] == "T-1_ok" and stored["y" * 64] == "y" * 64
    assert stored["café #12"].startswith("caf_12-")
    assert stored["ticket 48213"].startswith("ticket_48213-")

    export_results(store, "tickets", tmp_path / "out.csv")
    with (tmp_path / "out.csv").open(encoding="utf-8", newline="") as f:
        out = list(csv.DictReader(f))
    assert [r["ticket_id"] for r in out] == ODD_KEYS  # unchanged, in source order
    for r in out:
        assert r["custom_id"] == stored[r["ticket_id"]]
        assert r["state"] == "succeeded"
        assert r["output"] == f"Ticket: {r['body']}"


def test_odd_ids_in_jsonl_join_back_after_export(sqlite_store, clock, tmp_path):
    keys = ["a b", "a_b", 7, "ünï", "a b "]  # "a b " trims to "a b": a duplicate
    lines = [json.dumps({"ticket_id": k, "body": f"b{i}"}) for i, k in enumerate(keys)]
    (tmp_path / "t.jsonl").write_text("\n".join(lines[:4]) + "\n", encoding="utf-8")
    drive_to_end(sqlite_store, spec_for(tmp_path / "t.jsonl"), clock)
    export_results(sqlite_store, "tickets", tmp_path / "out.jsonl")
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["ticket_id"] for r in out] == keys[:4]
    assert [r["output"] for r in out] == [f"Ticket: b{i}" for i in range(4)]
    assert out[0]["custom_id"] != out[1]["custom_id"] == "a_b"

    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    msg = str(refused(sqlite_store, spec_for(tmp_path / "t.jsonl"), clock, SourceError))
    assert f'rows 1, 5: duplicate id "{custom_id_for("a b")}"' in msg


def test_jsonl_id_with_a_lone_surrogate_is_refused_cleanly(sqlite_store, clock, tmp_path):
    (tmp_path / "t.jsonl").write_text('{"ticket_id": "A\\ud800", "body": "x"}\n', encoding="utf-8")
    msg = str(refused(sqlite_store, spec_for(tmp_path / "t.jsonl"), clock, SourceError))
    assert "t.jsonl row 1" in msg and "ticket_id" in msg


def test_a_lone_surrogate_in_a_cell_is_refused_naming_row_and_column(store, clock, tmp_path, finished):
    # JSON reads "\ud800" as a lone surrogate: the store's insert raised UnicodeEncodeError
    rows = [{"ticket_id": "A", "body": "fine"}, {"ticket_id": "B", "body": "half an emoji \ud83d"}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    msg = str(refused(store, spec_for(tmp_path / "t.jsonl"), clock, SourceError))
    assert 't.jsonl row 2: column "body" holds a lone surrogate' in msg and "fix the cell" in msg
    assert snapshot(store) == finished


# 7-9. templates -------------------------------------------------------------------------


def test_template_syntax_error_names_the_template_and_line(store, clock, tmp_path, finished):
    spec = spec_for(tmp_path / "t.csv", template={"user": "Ticket:\n{{ body }}\n{% if channel %}web"})
    with pytest.raises(TemplateError) as info:
        load_job(store, spec, clock, where="classify.yaml")
    msg = str(info.value)
    assert "classify.yaml template.user line 3: template syntax error" in msg
    assert "endif" in msg  # jinja says what it expected
    assert snapshot(store) == finished


def test_template_file_syntax_error_names_the_file(sqlite_store, clock, tmp_path):
    write_csv(tmp_path / "t.csv", ticket_rows(3))
    (tmp_path / "classify.j2").write_text("Ticket: {{ body }}\n\n{{ body | }}\n", encoding="utf-8")
    spec = spec_for(tmp_path / "t.csv", template={"user": None, "user_file": str(tmp_path / "classify.j2")})
    msg = str(refused(sqlite_store, spec, clock, TemplateError))
    assert "classify.j2 line 3: template syntax error" in msg


def test_template_variable_without_a_column(store, clock, tmp_path, finished):
    spec = spec_for(tmp_path / "t.csv", template={"user": "Ticket:\n{{ body }} from {{ chanel }}"})
    err = refused(store, spec, clock, TemplateError)
    msg = str(err)
    assert 'template.user line 2 uses "chanel", but t.csv has no such column' in msg
    assert "columns are: ticket_id, channel, body, gold" in msg
    assert snapshot(store) == finished


def test_empty_value_in_a_template_column_names_row_column_and_hint(store, clock, tmp_path, finished):
    rows = ticket_rows(12)
    rows[2]["body"] = ""
    rows[11]["body"] = "  "
    source = write_csv(tmp_path / "t.csv", rows)
    err = refused(store, spec_for(source), clock, SourceError)
    assert len(err.problems) == 2
    msg = str(err)
    assert 't.csv row 3 (line 4): column "body" is empty; the template uses it' in msg
    assert "template.user line 1" in msg
    assert 't.csv row 12 (line 13): column "body" is empty' in msg
    assert "source.optional_columns" in msg
    assert snapshot(store) == finished

    # Declaring the column optional makes the same file load, and only the new rows are added.
    report = load_job(store, spec_for(source, source={"optional_columns": ["body"]}), clock)
    assert (report.rows, report.new) == (12, 2)
    with store.begin() as conn:
        payload = conn.execute(sa.select(payload_text().label("payload")).where(requests.c.custom_id == "T1011")).scalar_one()
    assert json.loads(payload)["body"]["messages"][-1]["content"] == "Ticket:   "


def test_jsonl_row_lacking_a_template_key_names_row_line_and_variable(store, clock, tmp_path, finished):
    lines = [json.dumps({"ticket_id": f"J{i}", "body": f"b{i}"}) for i in range(4)]
    lines[2] = json.dumps({"ticket_id": "J2", "text": "wrong key"})
    (tmp_path / "t.jsonl").write_text(lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n", encoding="utf-8")
    err = refused(store, spec_for(tmp_path / "t.jsonl"), clock, SourceError)
    assert len(err.problems) == 1
    msg = str(err)
    assert "t.jsonl row 3 (line 4)" in msg
    assert "template.user line 1" in msg and "'body' is undefined" in msg
    assert "add the column or fix the template" in msg
    assert snapshot(store) == finished


def test_null_optional_value_renders_like_an_empty_csv_cell(sqlite_store, clock, tmp_path):
    (tmp_path / "t.jsonl").write_text(json.dumps({"ticket_id": "A", "body": "x", "note": None}) + "\n", encoding="utf-8")
    spec = spec_for(
        tmp_path / "t.jsonl", source={"optional_columns": ["note"]}, template={"user": "{{ body }}|{{ note }}"}
    )
    load_job(sqlite_store, spec, clock)
    with sqlite_store.begin() as conn:
        payload = json.loads(conn.execute(sa.select(payload_text().label("payload"))).scalar_one())
    assert payload["body"]["messages"][-1]["content"] == "x|"


def test_optional_column_may_be_absent_from_a_jsonl_row(sqlite_store, clock, tmp_path):
    lines = [json.dumps({"ticket_id": "A", "body": "x", "note": "n"}), json.dumps({"ticket_id": "B", "body": "y"})]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = spec_for(
        tmp_path / "t.jsonl", source={"optional_columns": ["note"]}, template={"user": "{{ body }}|{{ note }}"}
    )
    assert load_job(sqlite_store, spec, clock).new == 2


# 11-12. routes --------------------------------------------------------------------------


def test_unknown_route_lists_the_known_routes(store, clock, tmp_path, finished):
    err = refused(store, spec_for(tmp_path / "t.csv", route="ehco"), clock, UnknownRouteError)
    assert isinstance(err, InputError)
    msg = str(err)
    assert 'unknown route "ehco"' in msg
    assert f"known routes: {', '.join(known_routes())}" in msg  # every registered route, by name
    assert {"anthropic-batch", "echo", "echo-batch", "local", "openai-batch"} <= set(known_routes())
    assert "`route:`" in msg
    assert snapshot(store) == finished


def test_unknown_model_on_the_local_route_names_the_model_and_the_option(store, clock, tmp_path, finished):
    # Building the local route and checking the model never loads llama.cpp.
    spec = spec_for(tmp_path / "t.csv", route="local", model="gpt-9")
    with pytest.raises(SpecError) as info:
        load_job(store, spec, clock)
    msg = str(info.value)
    assert '"gpt-9"' in msg and "smollm2-135m-instruct" in msg and "route_options.model_path" in msg
    assert snapshot(store) == finished


def test_local_route_with_a_missing_model_file(sqlite_store, clock, tmp_path):
    write_csv(tmp_path / "t.csv", ticket_rows(2))
    spec = spec_for(tmp_path / "t.csv", route="local", model="gpt-9", route_options={"model_path": str(tmp_path / "m.gguf")})
    with pytest.raises(SpecError, match=r"m\.gguf; fix route_options\.model_path"):
        load_job(sqlite_store, spec, clock)


def test_unknown_route_option_is_refused(sqlite_store, clock, tmp_path):
    write_csv(tmp_path / "t.csv", ticket_rows(2))
    with pytest.raises(SpecError, match=r"unknown route_options \['rejects'\]"):
        load_job(sqlite_store, spec_for(tmp_path / "t.csv", route_options={"rejects": ["T1000"]}), clock)


@pytest.mark.parametrize("route", ["openai-batch", "anthropic-batch", "gemini-batch", "openai", "anthropic", "gemini", "openai-compatible"])
def test_a_key_pasted_into_api_key_env_is_not_repeated_in_the_error(store, clock, tmp_path, finished, route):
    # The error said "set the environment variable sk-proj-…": the key itself, in the terminal and the logs
    key = "sk-proj-Zq3xY9" + "a1B2c3D4" * 5
    spec = spec_for(tmp_path / "t.csv", route=route, model="gpt-4o-mini", route_options={"api_key_env": key, "base_url": "http://127.0.0.1:9/v1"})
    msg = str(refused(store, spec, clock, SpecError))
    assert key not in msg and key[:12] not in msg
    assert f"{route}: no API key: route_options.api_key_env must name the environment variable that holds the key" in msg
    assert snapshot(store) == finished


# 13. the spec file ----------------------------------------------------------------------

SPEC_WITH_UNKNOWN_KEYS = """\
name: tickets
source:
  path: t.csv
  id_column: ticket_id
  id_colum: ticket_id
template:
  user: "Ticket: {{ body }}"
model: test-model
route: echo
retries: 3
"""


def test_spec_unknown_keys_name_file_line_and_known_keys(store, clock, tmp_path, finished):
    (tmp_path / "job.yaml").write_text(SPEC_WITH_UNKNOWN_KEYS, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "job.yaml")
    err = info.value
    assert len(err.problems) == 2
    msg = str(err)
    path = tmp_path / "job.yaml"
    assert f"{path}: invalid job spec: 2 problem(s)" in msg
    assert (
        f"{path} line 10: unknown key `retries`; known keys here: name, source, template, model, "
        "route, route_options, endpoint, packing, truncate, param_columns, params, choices, response_schema, repair, deadline, retry, fallback, "
        "auto, output, retention, chunk_size, budget_usd, notify, tags"
    ) in msg
    assert f"{path} line 5: unknown key `source.id_colum`; known keys here: path, url, table, query, id_column, format, optional_columns, filter, since, types" in msg
    assert "base_dir" not in msg
    assert snapshot(store) == finished


def test_spec_unknown_key_in_an_optional_section(tmp_path):
    text = SPEC_WITH_UNKNOWN_KEYS.replace("retries: 3\n", "output:\n  path: out.csv\n  compress: true\n")
    (tmp_path / "job.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(SpecError, match=r"line 12: unknown key `output.compress`; known keys here: path, format"):
        load_spec(tmp_path / "job.yaml")


def test_spec_missing_and_wrong_values_name_the_line(tmp_path):
    text = SPEC_WITH_UNKNOWN_KEYS.replace("  id_colum: ticket_id\n", "").replace("retries: 3\n", "params:\n  temperature: hot\n")
    text = text.replace("  id_column: ticket_id\n", "")
    (tmp_path / "job.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "job.yaml")
    msg = str(info.value)
    assert "line 2: `source.id_column` is required" in msg
    # The SDK's own type for the key says what the value must be.
    assert "line 8: `params`: temperature: must be a number, not text" in msg
    assert "fix the value" in msg


def test_spec_invalid_yaml_names_the_line(tmp_path):
    (tmp_path / "job.yaml").write_text('name: tickets\nsource: {path: t.csv\nmodel: "m"\n', encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "job.yaml")
    msg = str(info.value)
    assert str(tmp_path / "job.yaml") in msg and "not valid YAML" in msg
    assert re.search(r"job\.yaml line \d+:", msg)


def test_spec_that_is_a_list_is_refused(tmp_path):
    (tmp_path / "job.yaml").write_text("- name: tickets\n- route: echo\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"job\.yaml: a job spec is a YAML mapping with keys name, source"):
        load_spec(tmp_path / "job.yaml")


def test_spec_file_missing(tmp_path):
    with pytest.raises(SpecError, match=r"nope\.yaml: cannot read the job spec"):
        load_spec(tmp_path / "nope.yaml")


# 14-15. rows ----------------------------------------------------------------------------


def test_csv_row_with_the_wrong_number_of_fields(store, clock, tmp_path, finished):
    lines = ["ticket_id,channel,body,gold"] + [f"T{1000 + i},email,ticket {i},billing" for i in range(12)]
    lines[3] = "T1002,email,refund, please,billing"  # an unquoted comma: 5 fields
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    err = refused(store, spec_for(tmp_path / "t.csv"), clock, SourceError)
    msg = str(err)
    assert "t.csv row 3 (line 4): has 5 fields, the header has 4" in msg
    assert "quote values that contain commas" in msg
    assert snapshot(store) == finished


def test_many_bad_rows_are_all_reported(store, clock, tmp_path, finished):
    rows = ticket_rows(80)
    for i in (1, 4):
        rows[i]["ticket_id"] = ""
    for i in range(20, 80):
        rows[i]["body"] = ""
    write_csv(tmp_path / "t.csv", rows)
    err = refused(store, spec_for(tmp_path / "t.csv"), clock, SourceError)
    assert len(err.problems) == 62
    assert sum("id column" in p for p in err.problems) == 2
    assert sum('column "body" is empty' in p for p in err.problems) == 60
    assert {int(re.search(r"row (\d+)", p).group(1)) for p in err.problems} == {2, 5, *range(21, 81)}
    msg = str(err)
    assert "62 problem(s)" in msg and "… and 12 more" in msg  # the message shows the first 50
    assert snapshot(store) == finished


def test_duplicates_are_reported_alongside_other_problems(sqlite_store, clock, tmp_path):
    rows = ticket_rows(6)
    rows[3]["ticket_id"] = rows[0]["ticket_id"]
    rows[5]["body"] = ""
    write_csv(tmp_path / "t.csv", rows)
    err = refused(sqlite_store, spec_for(tmp_path / "t.csv"), clock, SourceError)
    assert len(err.problems) == 2
    assert 'rows 1, 4: duplicate id "T1000"' in str(err)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_rows_after_a_malformed_record_keep_their_numbers(sqlite_store, clock, tmp_path, fmt):
    """A record that is no row (a ragged CSV record, a JSONL line that is not JSON) still takes
    its row number: every later problem named the row before the one meant."""
    if fmt == "csv":
        (tmp_path / "t.csv").write_text("ticket_id,body\n1,a\n2,b,x\n3,\n4,d\n4,e\n", encoding="utf-8")
    else:
        lines = ['{"ticket_id": 1, "body": "a"}', '{"ticket_id": 2, "body": "b",}', '{"ticket_id": 3, "body": ""}',
                 '{"ticket_id": 4, "body": "d"}', '{"ticket_id": 4, "body": "e"}']  # fmt: skip
        (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    err = refused(sqlite_store, spec_for(tmp_path / f"t.{fmt}"), clock, SourceError)
    assert len(err.problems) == 3, err.problems
    row = "t.csv row 3 (line 4)" if fmt == "csv" else "t.jsonl row 3"  # a JSONL line is its row
    assert err.problems[1].startswith(f'{row}: column "body" is empty'), err.problems
    assert err.problems[2].startswith(f't.{fmt} rows 4, 5: duplicate id "4"'), err.problems


def test_a_bad_row_after_a_full_chunk_rolls_back_the_stored_chunk(store, clock, tmp_path, finished):
    from lowtide.core.sources import CHUNK_ROWS

    rows = ticket_rows(CHUNK_ROWS + 3)  # the first chunk is inserted before the bad row is read
    rows[-1]["body"] = ""
    write_csv(tmp_path / "t.csv", rows)
    err = refused(store, spec_for(tmp_path / "t.csv"), clock, SourceError)
    assert err.problems == [
        f't.csv row {CHUNK_ROWS + 3} (line {CHUNK_ROWS + 4}): column "body" is empty; the template uses it '
        "(job spec template.user line 1). Fill it in, or list it in source.optional_columns"
    ]
    assert snapshot(store) == finished


def test_bad_spec_change_to_a_stored_job_keeps_the_stored_spec(store, clock, tmp_path, finished):
    # The job row's spec is rewritten inside the load transaction; a refusal rolls it back.
    rows = ticket_rows(10)
    rows[7]["channel"] = ""
    write_csv(tmp_path / "t.csv", rows)
    spec = spec_for(tmp_path / "t.csv", model="other-model", template={"user": "{{ channel }}: {{ body }}"})
    # Without --requeue-changed the spec change itself is refused; with it, the bad row is.
    err = refused(store, spec, clock, SpecError)
    assert "was stored with model test-model; this spec says other-model" in str(err)
    with pytest.raises(SourceError) as info:
        load_job(store, spec, clock, requeue_changed=True)
    assert 't.csv row 8 (line 9): column "channel" is empty' in str(info.value)
    assert snapshot(store) == finished


# 16. what a request says: params, parts, conversations (issue 13) -----------------------

PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000") + b"\0" * 40


@pytest.fixture
def provider_keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")


def other_job(path: Path, /, **overrides: Any) -> JobSpec:
    """A new job over `source` (the stored "tickets" job stays as it is)."""
    return spec_for(path, name="other", **overrides)


def photo_rows(tmp_path: Path, cells: list[str]) -> Path:
    rows = [r | {"photo": cell} for r, cell in zip(ticket_rows(len(cells)), cells, strict=True)]
    return write_csv(tmp_path / "p.csv", rows)


def test_unknown_param_names_the_key_and_lists_the_endpoints_own(tmp_path):
    text = SPEC_WITH_UNKNOWN_KEYS.replace("  id_colum: ticket_id\n", "").replace("retries: 3\n", "params:\n  max_tokenz: 5\n")
    (tmp_path / "job.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "job.yaml")
    msg = str(info.value)
    assert 'job.yaml line 9: `params`: "max_tokenz" is not a parameter of /v1/chat/completions' in msg
    assert "max_completion_tokens" in msg and "reasoning_effort" in msg  # its parameters, listed


def test_a_tool_whose_parameters_are_not_a_json_schema_is_refused_by_line(tmp_path):
    text = SPEC_WITH_UNKNOWN_KEYS.replace("  id_colum: ticket_id\n", "").replace(
        "retries: 3\n",
        "params:\n  tools:\n    - type: function\n      function: {name: tag, parameters: {type: objekt}}\n",
    )
    (tmp_path / "job.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "job.yaml")
    msg = str(info.value)
    assert "job.yaml line 9: `params`: tools[0].function.parameters: not a valid JSON Schema: 'objekt' is not valid" in msg
    assert "fix the tool's schema" in msg


def test_a_missing_image_names_row_column_and_fix(store, clock, tmp_path, finished, provider_keys):
    (tmp_path / "a.png").write_bytes(PNG)
    source = photo_rows(tmp_path, ["a.png", "gone.png", "a.png"])
    spec = other_job(source, route="openai-batch", base_dir=str(tmp_path), template={"images": [{"column": "photo"}]})
    err = refused(store, spec, clock, SourceError)
    assert err.problems == [
        f'p.csv row 2 (line 3): template.images (column "photo") no such file: {tmp_path / "gone.png"} '
        "(paths are relative to the spec's folder), and not a URL or base64; fix the path or the cell"
    ]
    assert snapshot(store) == finished


def test_an_empty_image_cell_is_refused_unless_the_column_is_optional(sqlite_store, clock, tmp_path, provider_keys):
    (tmp_path / "a.png").write_bytes(PNG)
    source = photo_rows(tmp_path, ["a.png", ""])
    spec = other_job(source, route="openai-batch", base_dir=str(tmp_path), template={"images": [{"column": "photo"}]})
    err = refused(sqlite_store, spec, clock, SourceError)
    assert 'p.csv row 2 (line 3): column "photo" is empty; the template uses it (template.images (column "photo"))' in str(err)
    spec = other_job(source, route="openai-batch", base_dir=str(tmp_path), template={"images": [{"column": "photo"}]},
                     source={"optional_columns": ["photo"]})  # fmt: skip
    assert load_job(sqlite_store, spec, clock).new == 2


def test_an_image_too_large_for_the_provider_is_refused(store, clock, tmp_path, finished, provider_keys):
    (tmp_path / "big.png").write_bytes(PNG + b"\0" * (4 * 1024 * 1024))  # 4 MB: 5.3 MB as base64
    source = photo_rows(tmp_path, ["big.png"])
    spec = other_job(source, route="anthropic-batch", base_dir=str(tmp_path), template={"images": [{"column": "photo"}]})
    msg = str(refused(store, spec, clock, SourceError))
    assert 'p.csv row 1 (line 2): template.images (column "photo") is 5.3 MB (base64 size), over anthropic\'s limit of 5 MB' in msg
    assert "make it smaller, or pass a URL" in msg
    assert snapshot(store) == finished


def test_what_is_not_an_image_is_refused(store, clock, tmp_path, finished, provider_keys):
    (tmp_path / "notes.txt").write_text("not a picture", encoding="utf-8")
    source = photo_rows(tmp_path, ["notes.txt"])
    spec = other_job(source, route="openai-batch", base_dir=str(tmp_path), template={"images": [{"column": "photo"}]})
    msg = str(refused(store, spec, clock, SourceError))
    assert 'p.csv row 1 (line 2): template.images (column "photo") is not an image (its bytes are no known type)' in msg
    assert snapshot(store) == finished


def test_a_part_the_route_does_not_take_is_refused_by_the_route(store, clock, tmp_path, finished):
    (tmp_path / "a.png").write_bytes(PNG)
    source = photo_rows(tmp_path, ["a.png", "a.png"])
    spec = other_job(source, base_dir=str(tmp_path), template={"images": [{"column": "photo"}]})  # echo: text only
    msg = str(refused(store, spec, clock, SourceError))
    assert "p.csv rows 1, 2: messages[1].content[1]: content part 'image_url' is not taken by this route (text only) (route echo)" in msg
    assert "send the job to a route that takes it" in msg
    assert snapshot(store) == finished


def test_n_above_one_on_a_route_that_returns_one_choice(store, clock, tmp_path, finished, monkeypatch):
    # A chat body sent to Anthropic: its Messages API gives one answer per request.
    monkeypatch.setenv("LOWTIDE_T_KEY", "sk-test-key-123")
    spec = other_job(tmp_path / "t.csv", route="anthropic", route_options={"api_key_env": "LOWTIDE_T_KEY"},
                     endpoint="/v1/chat/completions", params={"n": 2, "max_tokens": 16})  # fmt: skip
    msg = str(refused(store, spec, clock, SourceError))
    assert "t.csv rows 1, 2, 3, 4, 5, 6, 7, 8, 9, 10: n: Anthropic returns one answer per request; got n=2 (route anthropic)" in msg
    assert snapshot(store) == finished


def test_a_conversation_cell_that_is_not_a_conversation(store, clock, tmp_path, finished):
    good = [{"role": "user", "content": "hi"}]
    bad_part = [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image", "source": {}}]}]
    (tmp_path / "c.jsonl").write_text(
        "\n".join(json.dumps({"ticket_id": f"C{i}", "conv": c}) for i, c in enumerate([good, bad_part, "nope", [{"role": "tool", "content": "x"}]])) + "\n",
        encoding="utf-8",
    )
    spec = other_job(tmp_path / "c.jsonl", template={"system": None, "user": None, "messages_column": "conv"})
    err = refused(store, spec, clock, SourceError)
    fix = 'the cell must hold a list of /v1/chat/completions messages (docs/jobs.md "Conversations")'
    assert err.problems == [
        f"c.jsonl row 2: column \"conv\" message 1, part 2 (messages[0].content[1].type): 'image' is not one of file, image_url, input_audio, text; {fix}",
        f'c.jsonl row 3: column "conv" is not JSON (Expecting value); {fix}',
        f'c.jsonl row 4: column "conv" message 1 (messages[0]): `tool_call_id` is required; {fix}',
    ]
    assert snapshot(store) == finished


def test_a_param_column_cell_of_the_wrong_type(store, clock, tmp_path, finished, provider_keys):
    rows = [r | {"seed": s} for r, s in zip(ticket_rows(3), ["1", "abc", ""], strict=True)]
    source = write_csv(tmp_path / "s.csv", rows)
    spec = other_job(source, route="openai-batch", param_columns={"seed": "seed"})
    err = refused(store, spec, clock, SourceError)
    assert err.problems == ["s.csv row 2 (line 3): column \"seed\" (param_columns.seed): 'abc' is not an integer; fix the cell"]
    assert snapshot(store) == finished


def test_a_param_column_the_source_lacks_is_refused_up_front(sqlite_store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(2))
    msg = str(refused(sqlite_store, other_job(source, param_columns={"seed": "seed"}), clock, SourceError))
    assert 't.csv: param_columns.seed names column "seed", which it does not have; columns are: ticket_id, channel, body, gold' in msg
