"""The job spec: defaults, formats, choices, schema and deadline checks, YAML loading."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from lowtide.core.errors import InputError, SpecError
from lowtide.core.spec import JobSpec, build_spec, format_of, load_spec


def minimal(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "tickets",
        "source": {"path": "t.csv", "id_column": "ticket_id"},
        "template": {"user": "{{ body }}"},
        "model": "m",
        "route": "echo",
    }
    data.update(overrides)
    return data


def test_defaults():
    spec = build_spec(minimal())
    assert spec.params == {} and spec.output_limit is None  # nothing is invented
    assert spec.request_endpoint == "/v1/chat/completions"
    assert (spec.retry.max_attempts, spec.retry.backoff_seconds, spec.retry.max_backoff_seconds) == (3, 30.0, 3600.0)
    assert spec.route_options == {} and spec.source.optional_columns == []
    assert spec.source.format is None and spec.template.system is None
    assert spec.choices is None and spec.response_schema is None and spec.deadline is None
    assert spec.output is None and spec.chunk_size is None and spec.base_dir == "."
    assert spec.effective_choices is None


def test_spec_is_frozen_and_round_trips_through_json():
    spec = build_spec(minimal(choices=["a", "b"], deadline="2030-01-02T03:04:05Z"))
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        spec.model = "other"  # type: ignore[misc]
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec


@pytest.mark.parametrize(
    ("path", "fmt"),
    [("a.csv", "csv"), ("A.CSV", "csv"), ("x/y.jsonl", "jsonl"), ("y.ndjson", "jsonl"), ("z.parquet", "parquet")],
)
def test_format_of_by_extension(path, fmt):
    assert format_of(path) == fmt


def test_format_of_declared_wins_and_unknown_is_refused():
    assert format_of("data.txt", "csv") == "csv"
    with pytest.raises(SpecError) as info:
        format_of("book.xlsx")
    msg = str(info.value)
    assert 'book.xlsx: unknown file extension ".xlsx"' in msg
    assert ".csv, .jsonl, .ndjson, .parquet" in msg and "`format:`" in msg
    with pytest.raises(SpecError, match='unknown file extension ""'):
        format_of("noext")


def test_effective_choices_from_a_schema_enum():
    spec = build_spec(minimal(response_schema={"type": "string", "enum": ["billing", "technical", 3]}))
    assert spec.effective_choices == ["billing", "technical", "3"]
    both = build_spec(minimal(choices=["x", "y"], response_schema={"enum": ["a", "b"]}))
    assert both.effective_choices == ["x", "y"]  # explicit choices win
    obj = build_spec(minimal(response_schema={"type": "object", "properties": {"label": {"enum": ["a", "b"]}}}))
    assert obj.effective_choices is None  # only a top-level enum counts


@pytest.mark.parametrize("choices", [["only"], ["a", "a"], ["a", " "], []])
def test_bad_choices_are_refused(choices):
    with pytest.raises(SpecError, match="give at least two distinct, non-empty choices"):
        build_spec(minimal(choices=choices))


def test_invalid_json_schema_is_refused_with_the_field():
    with pytest.raises(SpecError) as info:
        build_spec(minimal(response_schema={"type": "nope"}), where="job.yaml")
    msg = str(info.value)
    assert "job.yaml: invalid job spec" in msg
    assert "`response_schema`: not a valid JSON Schema" in msg


def test_valid_object_schema_is_kept():
    schema = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    assert build_spec(minimal(response_schema=schema)).response_schema == schema


@pytest.mark.parametrize("naive", ["2030-05-01T12:00:00", "2030-05-01 12:00", datetime(2030, 5, 1, 12)])
def test_a_deadline_without_utc_offset_is_refused_with_the_fix(naive):
    # Read as UTC it would be hours off for anyone not in UTC, silently (issue 15 item 7).
    with pytest.raises(SpecError) as info:
        build_spec(minimal(deadline=naive))
    msg = str(info.value)
    assert "deadline" in msg and "2030-05-01T12:00:00 has no UTC offset" in msg
    assert "add `Z` for UTC (e.g. 2030-05-01T12:00:00Z) or an offset such as +02:00" in msg


def test_an_aware_deadline_is_kept_with_its_offset():
    assert build_spec(minimal(deadline="2030-05-01T12:00:00Z")).deadline == datetime(2030, 5, 1, 12, tzinfo=UTC)
    aware = build_spec(minimal(deadline="2030-05-01T12:00:00+02:00")).deadline
    assert aware.utcoffset() == timedelta(hours=2)
    assert aware == datetime(2030, 5, 1, 10, tzinfo=UTC)
    tz = timezone(timedelta(hours=-5))
    assert build_spec(minimal(deadline=datetime(2030, 5, 1, 12, tzinfo=tz))).deadline.tzinfo == tz


@pytest.mark.parametrize("name", ["", "-leading", "has space", "x" * 65, "ünï"])
def test_bad_job_names_are_refused(name):
    with pytest.raises(SpecError, match="`name`: use 1-64 letters"):
        build_spec(minimal(name=name))


@pytest.mark.parametrize("name", ["a", "classify-tickets", "v1.2_run", "x" * 64])
def test_good_job_names(name):
    assert build_spec(minimal(name=name)).name == name


@pytest.mark.parametrize(
    ("template", "fix"),
    [
        ({}, "give exactly one of `user`"),
        ({"user": "a", "user_file": "b.j2"}, "give exactly one of `user`"),
        ({"user": "a", "system": "s", "system_file": "s.j2"}, "give at most one of `system`"),
    ],
)
def test_template_section_needs_one_of_each(template, fix):
    with pytest.raises(SpecError, match=fix):
        build_spec(minimal(template=template))


def test_value_ranges_are_checked():
    with pytest.raises(SpecError) as info:
        build_spec(minimal(params={"max_tokenz": 5}, retry={"max_attempts": 0}, chunk_size=0))
    err = info.value
    assert isinstance(err, InputError)
    fields = sorted(p.split("`")[1] for p in err.problems)
    assert fields == ["chunk_size", "params", "retry.max_attempts"]


def test_missing_required_keys_are_each_named():
    with pytest.raises(SpecError) as info:
        build_spec({"name": "x", "source": {"path": "a.csv"}})
    msg = str(info.value)
    for field in ("source.id_column", "template", "model", "route"):
        assert f"`{field}` is required" in msg
    assert len(info.value.problems) == 4


def test_resolve_is_relative_to_base_dir(tmp_path):
    spec = build_spec(minimal(base_dir=str(tmp_path)))
    assert spec.resolve("data/t.csv") == tmp_path / "data" / "t.csv"
    assert spec.resolve(str(tmp_path / "abs.csv")) == tmp_path / "abs.csv"
    assert spec.resolve("~/x.csv") == Path.home() / "x.csv"


def test_load_spec_sets_base_dir_to_the_spec_folder(tmp_path, monkeypatch):
    folder = tmp_path / "jobs"
    folder.mkdir()
    (folder / "job.yaml").write_text(
        "name: tickets\n"
        "source: {path: data/t.csv, id_column: ticket_id}\n"
        "template:\n  user: 'Ticket: {{ body }}'\n"
        "model: m\nroute: echo\n"
        "deadline: 2030-05-01 12:00:00Z\n"
        "response_schema: {enum: [a, b]}\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)  # a relative spec path still resolves against its folder
    spec = load_spec(Path("jobs/job.yaml"))
    assert Path(spec.base_dir) == folder.resolve()
    assert spec.resolve(spec.source.path) == folder.resolve() / "data" / "t.csv"
    assert spec.deadline == datetime(2030, 5, 1, 12, tzinfo=UTC)
    assert spec.effective_choices == ["a", "b"]


def test_load_spec_empty_file_is_refused(tmp_path):
    (tmp_path / "job.yaml").write_text("", encoding="utf-8")
    with pytest.raises(SpecError, match="a job spec is a YAML mapping"):
        load_spec(tmp_path / "job.yaml")


def test_load_spec_nested_unknown_key_in_params(tmp_path):
    (tmp_path / "job.yaml").write_text(
        "name: tickets\nsource: {path: t.csv, id_column: id}\ntemplate: {user: x}\nmodel: m\nroute: echo\n"
        "params:\n  max_tokens: 5\n  top_pp: 0.9\n",
        encoding="utf-8",
    )
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "job.yaml")
    said = str(info.value)
    assert 'line 6: `params`: "top_pp" is not a parameter of /v1/chat/completions; its parameters are: ' in said
    assert "top_p, " in said and "max_completion_tokens" in said  # the SDK's own keys, listed


def test_a_key_given_twice_in_the_spec_is_refused(tmp_path):
    (tmp_path / "job.yaml").write_text(
        "name: tickets\nsource: {path: t.csv, id_column: id}\ntemplate: {user: x}\n"
        "model: small\nroute: echo\nmodel: large\n",
        encoding="utf-8",
    )
    with pytest.raises(SpecError, match="model"):
        load_spec(tmp_path / "job.yaml")


# what a request says (issue 13) ----------------------------------------------------------


def refusal(**overrides: Any) -> str:
    with pytest.raises(SpecError) as info:
        build_spec(minimal(**overrides))
    return str(info.value)


def test_param_columns_name_parameters_of_the_endpoint():
    spec = build_spec(minimal(param_columns={"seed": "s", "temperature": "t"}))
    assert spec.param_columns == {"seed": "s", "temperature": "t"}
    assert '`param_columns`: "sede" is not a parameter of /v1/chat/completions' in refusal(param_columns={"sede": "s"})
    body = {"user": None, "body_column": "b"}
    assert "put their parameters in the body, not in param_columns" in refusal(template=body, param_columns={"seed": "s"})


def test_a_per_row_tool_choice_waits_for_the_row():
    # tool_choice "required" with the tools from a column: checked per row, not refused here.
    assert build_spec(minimal(params={"tool_choice": "required"}, param_columns={"tools": "tools"}))
    assert "asks for a tool, but params has no `tools`" in refusal(params={"tool_choice": "required"})


def test_images_and_files_need_a_user_template_and_a_conversation_endpoint():
    assert build_spec(minimal(template={"user": "{{ body }}", "images": [{"column": "p", "detail": "high"}]}))
    msg = refusal(template={"user": None, "messages_column": "m", "images": [{"column": "p"}]})
    assert "`images` and `files` are added to the user message: give a `user` template" in msg
    assert "`detail` is for images" in refusal(template={"user": "x", "files": [{"column": "f", "detail": "low"}]})
    msg = refusal(endpoint="/v1/completions", template={"user": "x", "images": [{"column": "p"}]})
    assert "/v1/completions takes a text prompt: images and files need" in msg


def test_param_columns_and_parts_are_rendering_keys():
    from lowtide.core.spec import spec_changes

    old = build_spec(minimal())
    new = build_spec(minimal(param_columns={"seed": "s"}))
    assert spec_changes(old, new).rendering == ['param_columns.seed (none) → s']


def test_a_spec_whose_aliases_expand_past_the_limit_is_refused_at_once(tmp_path):
    # Each line repeats the one before ten times: six lines are 111,111 values to every reader
    # after the parser (nine are a billion: `lowtide submit` ran for minutes)
    lines = ["name: t", "source: {path: t.csv, id_column: id}", "template: {user: x}", "model: m", "route: echo"]
    lines.append("x0: &a0 [" + ", ".join(["x"] * 10) + "]")
    lines += [f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 6)]
    (tmp_path / "job.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"job\.yaml: more than 100,000 values once its aliases \(\*name\) are expanded"):
        load_spec(tmp_path / "job.yaml")


def test_a_spec_nested_deeper_than_the_parser_goes_is_a_spec_error(tmp_path):
    (tmp_path / "job.yaml").write_text("name: t\nparams: {stop: " + "[" * 5000 + "]" * 5000 + "}\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"job\.yaml: nested too deep to read"):
        load_spec(tmp_path / "job.yaml")


@pytest.mark.parametrize("where", ["response_schema", "tools"])
def test_a_schema_nested_deeper_than_the_checker_goes_is_named(where):
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(150):
        schema = {"type": "object", "properties": {"a": schema}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    spec = minimal(response_schema=schema) if where == "response_schema" else minimal(params={"tools": tools})
    with pytest.raises(SpecError, match="not a valid JSON Schema: nested too deep to check; flatten it"):
        build_spec(spec)


def test_a_lone_surrogate_in_a_spec_is_named_by_key_and_line(tmp_path):
    # YAML reads "\ud800" as a lone surrogate, which no JSON encoder or store takes
    (tmp_path / "job.yaml").write_text(
        'name: t\nsource: {path: t.csv, id_column: id}\ntemplate:\n  user: "Say \\ud800 {{ body }}"\nmodel: m\nroute: echo\n', encoding="utf-8"
    )
    with pytest.raises(SpecError, match=r"job\.yaml line 4: `template\.user` holds a lone surrogate"):
        load_spec(tmp_path / "job.yaml")


def test_an_eval_spec_given_where_a_job_spec_is_wanted_is_named_so(tmp_path):
    """`lowtide submit` and `estimate` of an eval spec said "`model` is required" and
    "unknown key `variants`": a job spec's refusals, of a file that is no job spec."""
    path = tmp_path / "eval.yaml"
    path.write_text("name: ev\nsource: {path: t.csv, id_column: id}\ntemplate: {user: '{{ q }}'}\n"
                    "variants:\n  models: [{name: a, model: echo, route: echo}]\nscoring: {method: exact, expected: gold}\n")  # fmt: skip
    with pytest.raises(SpecError, match=r"eval.yaml: an eval spec \(it has `variants:`, docs/evals.md\), not a job spec; run it with `lowtide run "):
        load_spec(path)
