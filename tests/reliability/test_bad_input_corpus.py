"""The bad-input corpus (DESIGN invariant 7): one row = one bad input + the exact message
lowtide answers with. Job specs, sources, templates, response schemas and answers,
provider result lines, gateway requests (status and whole answer body) and gateway config files.

Every message is compared whole, so a change of wording is a visible change of this table.
`{dir}` stands for the test's folder. Source and template rows load into a fresh store and
check that nothing was stored; tests/engine/test_bad_input.py checks, for the same kinds of
input, that a store already holding a finished job is left exactly as it was.

Gateway requests are the gateway's own refusals. A body without `model` or `messages` is not
one: the gateway forwards it in real time (`X-Lowtide-Reason` says why it was not deferred)
and the upstream answers it, so it is tested in tests/gateway/, not here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from lowtide.core.clock import ManualClock
from lowtide.core.errors import InputError, SourceError, SpecError, TemplateError, UnknownRouteError
from lowtide.core.outputs import InvalidOutput, parse_output
from lowtide.core.spec import load_spec
from lowtide.engine.loader import load_job
from lowtide.routes import known_routes
from lowtide.routes.anthropic.batch import parse_result
from lowtide.routes.openai.batch import _parse
from lowtide.server.gateway import create_gateway_app, load_gateway_config
from lowtide.server.gateway.tenants import sha256_hex
from lowtide.store.db import Store
from lowtide.store.schema import jobs, requests
from tests.conftest import make_spec
from tests.gateway.conftest import KEYS, running_gateway

# -- job specs: YAML text → SpecError ----------------------------------------------------------

GOOD_SPEC = """\
name: tickets
source:
  path: t.csv
  id_column: ticket_id
template:
  user: "Ticket: {{ body }}"
model: test-model
route: echo
"""

KNOWN_TOP = (
    "name, source, template, model, route, route_options, endpoint, packing, truncate, param_columns, params, choices, "
    "response_schema, repair, deadline, retry, fallback, auto, output, retention, chunk_size, budget_usd, notify, tags, variant"
)

SPECS: list[tuple[str, str, str]] = [
    ("missing name", GOOD_SPEC.replace("name: tickets\n", ""),
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec}: `name` is required"),
    ("name with a space", GOOD_SPEC.replace("name: tickets", "name: my tickets"),
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 1: `name`: use 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit"),
    ("unknown top-level key", GOOD_SPEC + "retries: 3\n",
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 9: unknown key `retries`; known keys here: " + KNOWN_TOP),
    ("a key given twice", GOOD_SPEC + "model: other\n",
     "{spec} line 9: key `model` is given twice (first on line 7); keep one"),
    ("temperature not a number", GOOD_SPEC + "params:\n  temperature: hot\n",
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 9: `params`: temperature: must be a number, not text "
     "(the SDK's type for /v1/chat/completions `temperature`); fix the value"),
    ("max_tokens zero", GOOD_SPEC + "params:\n  max_tokens: 0\n",
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 9: `params`: max_tokens: 0 output tokens allows no answer; "
     "give 1 or more (or leave it out)"),
    ("max_attempts zero", GOOD_SPEC + "retry:\n  max_attempts: 0\n",
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 10: `retry.max_attempts`: Input should be greater than or equal to 1"),
    ("user and user_file both", GOOD_SPEC.replace('  user: "Ticket: {{ body }}"\n', '  user: "Ticket: {{ body }}"\n  user_file: t.j2\n'),
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 5: `template`: give exactly one of `user` (inline), `user_file` (a path), `messages_column` (rows that are "
     "conversations) or `body_column` (rows that are request bodies)"),
    ("no user message at all", GOOD_SPEC.replace('  user: "Ticket: {{ body }}"\n', "  system: Be brief.\n"),
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 5: `template`: give exactly one of `user` (inline), `user_file` (a path), `messages_column` (rows that are "
     "conversations) or `body_column` (rows that are request bodies)"),
    ("fallback on the same route", GOOD_SPEC + "fallback:\n  route: echo\n",
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec}: `(top level)`: `fallback.route` must differ from `route` (echo); retries on the same route are `retry:`"),
    ("one choice", GOOD_SPEC + "choices: [billing]\n",
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 9: `choices`: give at least two distinct, non-empty choices"),
    ("deadline not a date", GOOD_SPEC + "deadline: tomorrow\n",
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 9: `deadline`: Input should be a valid datetime or date, input is too short"),
    ("chunk_size zero", GOOD_SPEC + "chunk_size: 0\n",
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 9: `chunk_size`: Input should be greater than or equal to 1"),
    ("negative budget", GOOD_SPEC + "budget_usd: -5\n",
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 9: `budget_usd`: Input should be greater than 0"),
    ("a tag with a space", GOOD_SPEC + "tags: [nightly run]\n",
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 9: `tags`: tag 'nightly run': use 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit"),
    ("unknown source format", GOOD_SPEC.replace("  id_column: ticket_id\n", "  id_column: ticket_id\n  format: xlsx\n"),
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 5: `source.format`: Input should be 'csv', 'jsonl' or 'parquet'"),
    ("response schema that is no JSON Schema", GOOD_SPEC + "response_schema: {type: strng}\n",
     "{spec}: invalid job spec: 1 problem(s)\n  - {spec} line 9: `response_schema`: not a valid JSON Schema: 'strng' is not valid under any of the given schemas"),
    ("a list, not a mapping", "- name: tickets\n- route: echo\n",
     "{spec}: a job spec is a YAML mapping with keys name, source, template, model, route"),
    ("not YAML", "name: tickets\nsource: {path: t.csv\nmodel: m\n",
     "{spec} line 3: not valid YAML (expected ',' or '}', but got ':')"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in SPECS], ids=[c[0] for c in SPECS])
def test_job_spec_corpus(tmp_path, text, expected):
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value) == expected.replace("{spec}", str(path))


# -- sources, templates and route options: files + spec → refused by load_job -----------------

CSV = "ticket_id,channel,body\nT1,email,refund please\nT2,chat,login broken\n"


@dataclass
class Load:
    name: str
    files: dict[str, bytes | str]
    error: type[InputError]
    message: str
    source: str = "t.csv"
    overrides: dict[str, Any] = field(default_factory=dict)


LOADS: list[Load] = [
    Load("missing source file", {}, SourceError,
         "{dir}/t.csv: no such file; check `source.path` (relative to the spec file)"),
    Load("source is an empty folder", {"t.csv/": ""}, SourceError,
         "{dir}/t.csv: an empty folder; put the data files in it, or point `source.path` at the right one"),
    Load("empty CSV", {"t.csv": ""}, SourceError,
         "{dir}/t.csv: empty file; a CSV source needs a header row"),
    Load("a header name twice", {"t.csv": "ticket_id,body,body\nT1,a,b\n"}, SourceError,
         't.csv line 1: the header names "body" more than once; give each column its own name'),
    Load("unknown extension", {"t.xlsx": "PK"}, SpecError,
         '{dir}/t.xlsx: unknown file extension ".xlsx"; use one of .csv, .jsonl, .ndjson, .parquet or set `format:` explicitly',
         source="t.xlsx"),
    Load("no id column", {"t.csv": "id,body\nT1,x\n"}, SourceError,
         '{dir}/t.csv: no column "ticket_id" (source.id_column); columns are: id, body'),
    Load("an unquoted comma", {"t.csv": CSV + "T3,web,refund, please\n"}, SourceError,
         "{dir}/t.csv: refused, nothing was stored: 1 problem(s)\n"
         "  - t.csv row 3 (line 4): has 4 fields, the header has 3; quote values that contain commas"),
    Load("empty id", {"t.csv": CSV + ",web,hello\n"}, SourceError,
         "{dir}/t.csv: refused, nothing was stored: 1 problem(s)\n"
         '  - t.csv row 3 (line 4): id column "ticket_id" is empty; every row needs a unique id (source.id_column)'),
    Load("duplicate id", {"t.csv": CSV + "T1,web,again\n"}, SourceError,
         "{dir}/t.csv: refused, nothing was stored: 1 problem(s)\n"
         '  - t.csv rows 1, 3: duplicate id "T1" in column "ticket_id"; ids must be unique (remove or renumber the repeats)'),
    Load("JSONL line that is not JSON", {"t.jsonl": '{"ticket_id": "A", "body": "x"}\n{"ticket_id": "B", body: "y"}\n'},
         SourceError, "{dir}/t.jsonl: refused, nothing was stored: 1 problem(s)\n"
         "  - t.jsonl line 2: not valid JSON (Expecting property name enclosed in double quotes, column 20)",
         source="t.jsonl"),
    Load("JSONL line that is a list", {"t.jsonl": '["A", "x"]\n'}, SourceError,
         "{dir}/t.jsonl: refused, nothing was stored: 1 problem(s)\n  - t.jsonl line 1: each line must be a JSON object, got list",
         source="t.jsonl"),
    Load("template syntax error", {"t.csv": CSV}, TemplateError,
         "job spec template.user line 2: template syntax error: Encountered unknown tag 'endfor'.",
         overrides={"template": {"user": "Ticket: {{ body }}\n{% endfor %}"}}),
    Load("template variable with no column", {"t.csv": CSV}, TemplateError,
         'template: 1 problem(s)\n  - job spec template.user line 1 uses "bdy", but t.csv has no such column; '
         "columns are: ticket_id, channel, body",
         overrides={"template": {"user": "Ticket: {{ bdy }}"}}),
    Load("empty value the template uses", {"t.csv": CSV + "T3,web,\n"}, SourceError,
         "{dir}/t.csv: refused, nothing was stored: 1 problem(s)\n"
         '  - t.csv row 3 (line 4): column "body" is empty; the template uses it (job spec template.user line 1). '
         "Fill it in, or list it in source.optional_columns"),
    Load("template file missing", {"t.csv": CSV}, TemplateError,
         "{dir}/classify.j2: cannot read template (No such file or directory); check `template.user_file`",
         overrides={"template": {"user": None, "user_file": "classify.j2"}}),
    Load("a filter that fails on a row's value", {"t.csv": CSV}, SourceError,
         "{dir}/t.csv: refused, nothing was stored: 2 problem(s)\n"
         "  - t.csv row 1 (line 2): job spec template.user line 1: TypeError: unsupported operand type(s) for +: 'int' and 'str'\n"
         "  - t.csv row 2 (line 3): job spec template.user line 1: TypeError: unsupported operand type(s) for +: 'int' and 'str'",
         overrides={"template": {"user": "{{ body | length + channel }}"}}),
    Load("messages column that is not JSON", {"t.csv": 'ticket_id,conv\nT1,"[{role: user}]"\n'}, SourceError,
         "{dir}/t.csv: refused, nothing was stored: 1 problem(s)\n"
         '  - t.csv row 1 (line 2): column "conv" is not JSON (Expecting property name enclosed in double quotes); '
         'the cell must hold a list of /v1/chat/completions messages (docs/jobs.md "Conversations")',
         overrides={"template": {"user": None, "messages_column": "conv"}}),
    Load("messages column with a tool message", {"t.jsonl": json.dumps({"ticket_id": "T1", "conv": [{"role": "tool", "content": "x"}]}) + "\n"},
         SourceError,
         "{dir}/t.jsonl: refused, nothing was stored: 1 problem(s)\n"
         '  - t.jsonl row 1: column "conv" message 1 (messages[0]): `tool_call_id` is required; '
         'the cell must hold a list of /v1/chat/completions messages (docs/jobs.md "Conversations")',
         source="t.jsonl", overrides={"template": {"user": None, "messages_column": "conv"}}),
    Load("unknown route", {"t.csv": CSV}, UnknownRouteError,
         'unknown route "ehco"; known routes: {routes}. '
         "Fix the `route:` key of the job spec, or install the plugin that provides it.",
         overrides={"route": "ehco"}),
    Load("unknown route option", {"t.csv": CSV}, SpecError,
         "job spec: echo: unknown route_options ['slots']; known: ['answer', 'dispatch_size', 'fail_attempts', 'reject']",
         overrides={"route_options": {"slots": 4}}),
    Load("provider route without its key", {"t.csv": CSV}, SpecError,
         "job spec: openai-batch: no API key: set the environment variable LOWTIDE_CORPUS_UNSET_KEY",
         overrides={"route": "openai-batch", "route_options": {"api_key_env": "LOWTIDE_CORPUS_UNSET_KEY"}}),
]  # fmt: skip


def _write(folder: Path, files: dict[str, bytes | str]) -> None:
    for name, data in files.items():
        if name.endswith("/"):  # a folder
            (folder / name.rstrip("/")).mkdir()
        elif isinstance(data, bytes):
            (folder / name).write_bytes(data)
        else:
            (folder / name).write_text(data, encoding="utf-8")


@pytest.mark.parametrize("case", LOADS, ids=[c.name for c in LOADS])
def test_source_and_template_corpus(case: Load, tmp_path, monkeypatch):
    monkeypatch.delenv("LOWTIDE_CORPUS_UNSET_KEY", raising=False)
    folder = tmp_path / "in"
    folder.mkdir()
    _write(folder, case.files)
    spec = make_spec(folder / case.source, **case.overrides).model_copy(update={"base_dir": str(folder)})
    store = Store(str(tmp_path / "lowtide.db"))
    try:
        with pytest.raises(case.error) as info:
            load_job(store, spec, ManualClock())
        # The known routes are whatever is installed: other routes register as plugins do.
        assert str(info.value) == case.message.replace("{dir}", str(folder)).replace("{routes}", ", ".join(known_routes()))
        with store.begin() as conn:  # refused whole: no request, no job row left behind
            assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar_one() == 0
            assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0
    finally:
        store.close()


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"], ids=["plain", "with a BOM"])
def test_a_byte_that_is_not_utf8_early_in_a_csv_is_named_by_line_and_column(tmp_path, bom):
    (tmp_path / "t.csv").write_bytes(bom + b"ticket_id,body\nT1,caf\xe9\n")
    store = Store(str(tmp_path / "lowtide.db"))
    try:
        with pytest.raises(SourceError) as info:
            load_job(store, make_spec(tmp_path / "t.csv"), ManualClock())
    finally:
        store.close()
    assert "t.csv line 2, column 7: not UTF-8 text; save the file as UTF-8" in str(info.value)


# -- answers against the job's choices or response schema → InvalidOutput --------------------

SCHEMA = {"type": "object", "properties": {"label": {"enum": ["billing", "technical"]}}, "required": ["label"]}

ANSWERS: list[tuple[str, str, dict | None, list[str] | None, str]] = [
    ("not JSON", "label: billing", SCHEMA, None, "not valid JSON (Expecting value at line 1 column 1)"),
    ("missing a required key", '{"lable": "billing"}', SCHEMA, None, "does not match the schema at (root): 'label' is a required property"),
    ("a value outside the enum", '{"label": "sales"}', SCHEMA, None, "does not match the schema at label: 'sales' is not one of ['billing', 'technical']"),
    ("fenced, but cut short", '```json\n{"label": "billing"\n```', SCHEMA, None, "not valid JSON (Expecting ',' delimiter at line 1 column 20)"),
    ("not one of the choices", "Sales.", None, ["billing", "technical"], "answer 'Sales.' is not one of the choices: billing, technical"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "schema", "choices", "expected"), [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS])
def test_answer_corpus(text, schema, choices, expected):
    with pytest.raises(InvalidOutput) as info:
        parse_output(text, schema, choices)
    assert str(info.value) == expected


# -- result lines: what a provider's line becomes ----------------------------------------------
# (custom_id, ok, error_code, error_message, retryable), or None: the line is skipped and its
# request counts as missing from the output (retried as expired).

OPENAI_LINES: list[tuple[str, str, tuple | None]] = [
    ("corrupt: cut in half", '{"id": "r1", "custom_id": "T1", "response": {"status_', None),
    ("no custom_id", json.dumps({"id": "r1", "response": {"status_code": 200, "body": {}}}), None),
    ("a JSON list", '["T1"]', None),
    ("200 without choices", json.dumps({"custom_id": "T1", "response": {"status_code": 200, "body": {"choices": []}}}), None),
    ("status code as text", json.dumps({"custom_id": "T1", "response": {"status_code": "200", "body": {}}}), None),
    ("400 with an error body", json.dumps({"custom_id": "T1", "response": {"status_code": 400, "body": {"error": {"code": "invalid_value", "message": "bad max_tokens"}}}}),
     ("T1", False, "invalid_value", "HTTP 400: bad max_tokens", False)),
    ("429 without a body", json.dumps({"custom_id": "T1", "response": {"status_code": 429, "body": None}}),
     ("T1", False, "http_429", "HTTP 429: HTTP 429", True)),
    ("500 with an error type only", json.dumps({"custom_id": "T1", "response": {"status_code": 500, "body": {"error": {"type": "server_error"}}}}),
     ("T1", False, "server_error", "HTTP 500: HTTP 500", True)),
    ("batch expired", json.dumps({"custom_id": "T1", "response": None, "error": {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}}),
     ("T1", False, "batch_expired", "This request could not be executed before the completion window expired.", True)),
    ("error without code", json.dumps({"custom_id": "T1", "response": None, "error": {}}),
     ("T1", False, "unknown_error", "unknown_error", False)),
]  # fmt: skip


@pytest.mark.parametrize(("line", "expected"), [c[1:] for c in OPENAI_LINES], ids=[c[0] for c in OPENAI_LINES])
def test_openai_result_line_corpus(line, expected):
    outcome = _parse(line)
    if expected is None:
        assert outcome is None
    else:
        assert (outcome.custom_id, outcome.ok, outcome.error_code, outcome.error_message, outcome.retryable) == expected


ANTHROPIC_RESULTS: list[tuple[str, dict, tuple]] = [
    ("errored: invalid request", {"type": "errored", "error": {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"}}},
     ("T1", False, "invalid_request_error", "max_tokens: Field required", False)),
    ("errored: overloaded", {"type": "errored", "error": {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}},
     ("T1", False, "overloaded_error", "Overloaded", True)),
    ("errored without detail", {"type": "errored"}, ("T1", False, "api_error", "api_error", True)),
    ("canceled", {"type": "canceled"}, ("T1", False, "batch_cancelled", "request canceled", True)),
    ("expired", {"type": "expired"}, ("T1", False, "batch_expired", "request expired", True)),
    ("unknown type", {"type": "vanished"}, ("T1", False, "unknown_result", "unknown result type 'vanished'", True)),
]  # fmt: skip


@pytest.mark.parametrize(("result", "expected"), [c[1:] for c in ANTHROPIC_RESULTS], ids=[c[0] for c in ANTHROPIC_RESULTS])
def test_anthropic_result_corpus(result, expected):
    outcome = parse_result("T1", result)
    assert (outcome.custom_id, outcome.ok, outcome.error_code, outcome.error_message, outcome.retryable) == expected


# -- gateway requests: one request → the gateway's status and whole answer ------------------
# One gateway for every row (no upstream: nothing here is forwarded), tenants as in
# tests/gateway: acme and globex; `capped` has used its one request a minute (the clock does
# not move); `full` may have no deferred request waiting. `{other}` is globex's deferred id.

OPENAI_401 = {"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
TOO_LARGE = "The request body is too large: the limit is 1024 bytes."
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
DEFER = {"x-lowtide-defer": "1h"}


def _openai(status: int, message: str, type: str = "invalid_request_error", code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": None, "code": code}}


def _anthropic(type: str, message: str) -> dict:
    return {"type": "error", "error": {"type": type, "message": message}}


def _callback(url: str) -> dict[str, str]:
    return {**DEFER, "x-lowtide-callback": url}


@dataclass
class Call:
    name: str
    status: int
    answer: dict
    path: str = "/v1/chat/completions"
    method: str = "POST"
    tenant: str | None = "acme"  # whose key is sent; None: no key at all
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | Any = field(default_factory=lambda: CHAT)  # bytes as they are, else JSON
    chunked: bool = False  # sent without a Content-Length
    answer_headers: dict[str, str] = field(default_factory=dict)


GATEWAY_CALLS: list[Call] = [
    Call("no key", 401, OPENAI_401, tenant=None),
    Call("an unknown key", 401, OPENAI_401, tenant=None, headers={"authorization": "Bearer sk-nobody"}),
    Call("a key that is not a bearer token", 401, OPENAI_401, tenant=None, headers={"authorization": "Basic c2stYWNtZQ=="}),
    Call("an unknown key, Anthropic's API", 401, _anthropic("authentication_error", "invalid x-api-key"),
         path="/v1/messages", tenant=None, headers={"x-api-key": "sk-nobody"}),
    Call("no key for a status", 401, OPENAI_401, method="GET", path="/v1/deferred/{other}", tenant=None),
    Call("over the tenant's requests per minute", 429,
         _openai(429, "tenant capped: over its quota of 1 requests per minute", "requests", "rate_limit_exceeded"),
         tenant="capped", answer_headers={"retry-after": "60"}),
    Call("body over the size limit", 413, _openai(413, TOO_LARGE),
         body={**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}),
    Call("body over the size limit, chunked", 413, _openai(413, TOO_LARGE),
         body=b"{" + b" " * 2000 + b"}", chunked=True),
    Call("body over the size limit, Anthropic's API", 413, _anthropic("request_too_large", TOO_LARGE),
         path="/v1/messages", body={**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}),
    Call("body not JSON", 400, _openai(400, "The request body is not valid JSON: Expecting property name enclosed in "
                                             "double quotes: line 1 column 26 (char 25). Send one JSON object, UTF-8 encoded."),
         body=b'{"model": "gpt-4o-mini", messages: []}'),
    Call("body not UTF-8", 400, _openai(400, "The request body is not valid JSON: byte 14 is not UTF-8. Send one JSON "
                                              "object, UTF-8 encoded."),
         body=b'{"model": "caf\xe9"}'),
    Call("empty body", 400, _openai(400, "The request body is not valid JSON: Expecting value: line 1 column 1 (char 0). "
                                          "Send one JSON object, UTF-8 encoded."), body=b""),
    Call("body a JSON list", 400, _openai(400, "The request body must be a JSON object, not an array."), body=[CHAT]),
    Call("body not JSON, Anthropic's API", 400,
         _anthropic("invalid_request_error", "The request body is not valid JSON: Expecting value: line 1 column 1 "
                                             "(char 0). Send one JSON object, UTF-8 encoded."),
         path="/v1/messages", body=b"model=claude"),
    Call("X-Lowtide-Defer not a duration", 400,
         _openai(400, "X-Lowtide-Defer: expected a duration such as 90s, 10m, 2h or 1d; got 'tomorrow'"),
         headers={"x-lowtide-defer": "tomorrow"}),
    Call("X-Lowtide-Defer negative", 400,
         _openai(400, "X-Lowtide-Defer: expected a duration such as 90s, 10m, 2h or 1d; got '-5m'"),
         headers={"x-lowtide-defer": "-5m"}),
    Call("X-Lowtide-Prefer unknown", 400,
         _openai(400, "X-Lowtide-Prefer: give 'realtime' (or 'batch', the default); got 'fast'"),
         headers={**DEFER, "x-lowtide-prefer": "fast"}),
    Call("X-Lowtide-Priority unknown", 400,
         _openai(400, "X-Lowtide-Priority: the only value is 'realtime'; got 'high'"),
         headers={"x-lowtide-priority": "high"}),
    Call("callback on loopback", 400,
         _openai(400, "X-Lowtide-Callback: callback URL: host 127.0.0.1 resolves to a loopback address (127.0.0.1); callbacks there are not allowed"),
         headers=_callback("http://127.0.0.1:9/hook")),
    Call("callback on IPv6 loopback", 400,
         _openai(400, "X-Lowtide-Callback: callback URL: host ::1 resolves to a loopback address (::1); callbacks there are not allowed"),
         headers=_callback("http://[::1]:9/hook")),
    Call("callback on a private address", 400,
         _openai(400, "X-Lowtide-Callback: callback URL: host 10.1.2.3 resolves to a private address (10.1.2.3); callbacks there are not allowed"),
         headers=_callback("http://10.1.2.3/hook")),
    Call("callback on the cloud metadata address", 400,
         _openai(400, "X-Lowtide-Callback: callback URL: host 169.254.169.254 resolves to a link-local address (169.254.169.254); callbacks there are not allowed"),
         headers=_callback("http://169.254.169.254/latest/meta-data")),
    Call("callback on loopback, Anthropic's API", 400,
         _anthropic("invalid_request_error", "X-Lowtide-Callback: callback URL: host 127.0.0.1 resolves to a loopback address (127.0.0.1); callbacks there are not allowed"),
         path="/v1/messages", body={**CHAT, "max_tokens": 16}, headers=_callback("http://127.0.0.1:9/hook")),
    Call("callback with a scheme not allowed", 400,
         _openai(400, "X-Lowtide-Callback: callback URL: scheme 'ftp' is not allowed; use https or http"),
         headers=_callback("ftp://hooks.example.com/x")),
    Call("callback with credentials", 400,
         _openai(400, "X-Lowtide-Callback: callback URL: credentials in the URL are not allowed"),
         headers=_callback("https://user:pw@hooks.example.com/x")),
    Call("callback with no host", 400, _openai(400, "X-Lowtide-Callback: callback URL: no host"),
         headers=_callback("https:///hook")),
    Call("deferred over the tenant's pending quota", 429,
         _openai(429, "tenant full: 0 deferred requests are still waiting, its quota is 0", "requests", "rate_limit_exceeded"),
         tenant="full", headers=DEFER, answer_headers={"retry-after": "60"}),
    Call("another tenant's deferred id", 404, _openai(404, "No deferred request found with id '{other}'."),
         method="GET", path="/v1/deferred/{other}"),
    Call("an unknown deferred id", 404, _openai(404, "No deferred request found with id 'dfr_doesnotexist'."),
         method="GET", path="/v1/deferred/dfr_doesnotexist"),
    Call("another API path, with no upstream", 404, _openai(404, "Unknown path POST /v1/embeddings"),
         path="/v1/embeddings", body={"model": "text-embedding-3-small", "input": "hi"}),
]  # fmt: skip


@pytest.fixture(scope="module")
def corpus_gateway(tmp_path_factory):
    """One gateway on loopback for every row: (its URL, globex's deferred id)."""
    tmp_path = tmp_path_factory.mktemp("gateway")
    tenants = [{"name": name, "key_sha256": sha256_hex(key)} for name, key in KEYS.items()]
    tenants += [{"name": "capped", "key_sha256": sha256_hex("sk-capped"), "quotas": {"rpm": 1}},
                {"name": "full", "key_sha256": sha256_hex("sk-full"), "quotas": {"max_pending": 0}}]  # fmt: skip
    config = {
        "data_dir": str(tmp_path / "gateway-data"),
        "batch": {"openai": {"route": "echo"}, "anthropic": {"route": "echo"}},
        "collector": {"flush_size": 1000, "flush_age": 3600},  # nothing runs while we look
        "tenants": tenants,
        "webhooks": {"secret_env": "LOWTIDE_CORPUS_WEBHOOK_SECRET"},
        "max_body_bytes": 1024,
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOWTIDE_CORPUS_WEBHOOK_SECRET", "whsec-corpus")  # else every callback is refused alike
        with running_gateway(tmp_path, config, clock=ManualClock()) as g:
            with httpx.Client(base_url=g.url, timeout=30) as c:
                other = c.post("/v1/chat/completions", json=CHAT, headers={**DEFER, "authorization": f"Bearer {KEYS['globex']}"})
                assert other.status_code == 202, other.text
                capped = c.post("/v1/chat/completions", json=CHAT, headers={**DEFER, "authorization": "Bearer sk-capped"})
                assert capped.status_code == 202, capped.text  # its one request this minute
            yield g.url, other.json()["id"]


_KEYS = {**KEYS, "capped": "sk-capped", "full": "sk-full"}


@pytest.mark.parametrize("case", GATEWAY_CALLS, ids=[c.name for c in GATEWAY_CALLS])
def test_gateway_request_corpus(case: Call, corpus_gateway):
    url, other = corpus_gateway
    headers = dict(case.headers)
    if case.tenant is not None:
        headers["authorization"] = f"Bearer {_KEYS[case.tenant]}"
    body = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
    content = iter([body]) if case.chunked else body
    with httpx.Client(base_url=url, timeout=30) as c:
        if case.method == "GET":
            answer = c.get(case.path.replace("{other}", other), headers=headers)
        else:
            answer = c.request(case.method, case.path, content=content, headers={"content-type": "application/json", **headers})
    expected = json.loads(json.dumps(case.answer).replace("{other}", other))
    assert (answer.status_code, answer.json()) == (case.status, expected)
    for name, value in case.answer_headers.items():
        assert answer.headers.get(name) == value


# -- gateway config files: YAML text → SpecError, from loading or from starting the gateway --

GATEWAY_KNOWN_TOP = (
    "db, data_dir, public_url, upstreams, batch, collector, rules, classifier, default_max_wait, max_defer, tenants, "
    "callbacks, webhooks, max_body_bytes, max_upload_bytes, body_timeout, max_json_depth"
)

GATEWAY_CONFIGS: list[tuple[str, str, str]] = [
    ("unknown top-level key", "max_body: 4096\n",
     "{cfg}: invalid gateway config: 1 problem(s)\n  - {cfg} line 1: unknown key `max_body`; known keys here: " + GATEWAY_KNOWN_TOP),
    ("an upstream key in the file", "upstreams:\n  openai:\n    base_url: http://x/v1\n    api_key: sk-in-the-file\n",
     "{cfg}: invalid gateway config: 1 problem(s)\n  - {cfg} line 4: unknown key `upstreams.openai.api_key`; "
     "known keys here: base_url, api_key_env, timeout, max_connections, limits, price_as, forward_headers"),
    ("an upstream URL without a scheme", "upstreams:\n  openai: {base_url: api.openai.com/v1}\n",
     "{cfg}: invalid gateway config: 1 problem(s)\n  - {cfg} line 2: `upstreams.openai.base_url`: give an http:// or https:// URL"),
    ("flush_age not a duration", "collector:\n  flush_age: soon\n",
     "{cfg}: invalid gateway config: 1 problem(s)\n  - {cfg} line 2: `collector.flush_age`: expected a duration such as 90s, 10m, 2h or 1d; got 'soon'"),
    ("tenant key not a SHA-256", "tenants:\n  - {name: acme, key_sha256: sk-acme-raw-key}\n",
     "{cfg}: invalid gateway config: 1 problem(s)\n  - {cfg} line 2: `tenants.0.key_sha256`: String should match pattern '^[0-9a-fA-F]{64}$'"),
    ("a rule with an unknown action", "rules:\n  - {match: {tenant: acme}, action: later}\n",
     "{cfg}: invalid gateway config: 1 problem(s)\n  - {cfg} line 2: `rules.0.action`: Input should be 'realtime', 'defer' or 'prefer_realtime'"),
    ("size limit below 1024", "max_body_bytes: 10\n",
     "{cfg}: invalid gateway config: 1 problem(s)\n  - {cfg} line 1: `max_body_bytes`: Input should be greater than or equal to 1024"),
    ("a key given twice", "data_dir: a\ndata_dir: b\n",
     "{cfg} line 2: key `data_dir` is given twice (first on line 1); keep one"),
    ("a list, not a mapping", "- upstreams\n",
     "{cfg}: a gateway config is a YAML mapping with keys such as upstreams, batch, tenants"),
    ("not YAML", "data_dir: d\ncallbacks: {allow_loopback: true\nbatch: b\n",
     "{cfg} line 3: not valid YAML (expected ',' or '}', but got ':')"),
    ("an unknown batch route", "batch:\n  openai: {route: ehco}\n",
     'gateway config: batch.openai: unknown route "ehco"; known routes: {routes}. '
     "Fix the `route:` key of the job spec, or install the plugin that provides it."),
    ("an upstream key variable not set", "upstreams:\n  openai: {base_url: http://x/v1, api_key_env: LOWTIDE_CORPUS_UNSET_KEY}\n",
     "gateway config: upstreams.openai.api_key_env: set the environment variable LOWTIDE_CORPUS_UNSET_KEY"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in GATEWAY_CONFIGS], ids=[c[0] for c in GATEWAY_CONFIGS])
def test_gateway_config_corpus(tmp_path, monkeypatch, text, expected):
    monkeypatch.delenv("LOWTIDE_CORPUS_UNSET_KEY", raising=False)
    path = tmp_path / "gateway.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        create_gateway_app(load_gateway_config(path), db=str(tmp_path / "lowtide.db"))
    assert str(info.value) == expected.replace("{cfg}", str(path)).replace("{routes}", ", ".join(known_routes()))
