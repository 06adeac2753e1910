"""Property-based tests (hypothesis) of the parsers that read what others wrote: provider
result lines and job specs. Whatever comes in, each either gives a well-formed value or
refuses it in its documented way; none crashes with an exception nobody catches.

- An OpenAI output/error-file line (`openai_batch._parse`): an Outcome whose fields have
  their declared types, with the line's own `custom_id`, or None (skipped, logged; its
  request counts as missing from the output and is retried).
- An Anthropic result (`anthropic_batch.parse_result`): an Outcome with the custom_id it was
  given, or one of the errors `AnthropicBatchRoute.results` catches and skips a line for.
- A job spec (`build_spec`, `load_spec`): a JobSpec, or a SpecError each of whose problems
  names a key (`key` in backticks), the YAML, or the file.
"""

from __future__ import annotations

import json
import string

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lowtide.core.errors import SpecError
from lowtide.core.spec import JobSpec, build_spec, load_spec
from lowtide.core.types import Outcome, Usage
from lowtide.routes.anthropic.batch import parse_result
from lowtide.routes.openai.batch import _parse

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- JSON values, plain and shaped like the providers' lines ----------------------------------

scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def maybe(strategy):
    """A field that may be right, may be any JSON value, or may be left out (None)."""
    return st.one_of(strategy, json_values, st.none())


tokens = maybe(st.integers(0, 10**7))
openai_usage = maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": tokens,
            "completion_tokens": tokens,
            "prompt_tokens_details": maybe(st.fixed_dictionaries({}, optional={"cached_tokens": tokens})),
            "completion_tokens_details": maybe(st.fixed_dictionaries({}, optional={"reasoning_tokens": tokens})),
        },
    )
)
choice = st.fixed_dictionaries(
    {"message": maybe(st.fixed_dictionaries({}, optional={"role": maybe(st.just("assistant")), "content": maybe(st.text(max_size=30))}))},
    optional={"finish_reason": maybe(st.sampled_from(["stop", "length"])), "index": maybe(st.just(0))},
)
openai_error = maybe(
    st.fixed_dictionaries(
        {}, optional={"code": maybe(st.sampled_from(["rate_limit_exceeded", "batch_expired", "invalid_request"])), "message": maybe(st.text(max_size=30))}
    )
)
openai_body = maybe(
    st.fixed_dictionaries({}, optional={"choices": maybe(st.lists(choice, max_size=2)), "usage": openai_usage, "error": openai_error})
)
openai_lines = st.fixed_dictionaries(
    {},
    optional={
        "id": maybe(st.text(max_size=8)),
        "custom_id": maybe(st.text(max_size=20)),
        "response": maybe(st.fixed_dictionaries({}, optional={"status_code": maybe(st.sampled_from([200, 400, 429, 500])), "body": openai_body})),
        "error": openai_error,
    },
)


def well_formed(outcome: Outcome) -> None:
    """The types Outcome declares: what the engine writes to the store as it is."""
    assert isinstance(outcome.custom_id, str)
    assert isinstance(outcome.ok, bool)
    for name in ("text", "finish_reason", "error_code", "error_message"):
        value = getattr(outcome, name)
        assert value is None or isinstance(value, str), (name, value)
    assert isinstance(outcome.usage, Usage)
    for name in Usage.__slots__:
        value = getattr(outcome.usage, name)
        assert isinstance(value, int) and not isinstance(value, bool) and value >= 0, (name, value)
    if outcome.ok:
        assert isinstance(outcome.text, str)
    else:
        assert outcome.error_code and isinstance(outcome.retryable, bool)


# -- OpenAI output and error file lines --------------------------------------------------------


@SETTINGS
@given(st.text(max_size=200))
@example('{"custom_id": "T1", "response": {"status_code": 200, "body": {"choices": [{"message": {"content": "hi"}}]}}}')
@example("")
@example("null")
def test_any_text_is_an_openai_outcome_or_skipped(text):
    outcome = _parse(text)  # never raises
    assert outcome is None or isinstance(outcome, Outcome)


@SETTINGS
@given(st.one_of(openai_lines, json_values))
def test_any_json_line_is_an_outcome_for_its_custom_id_or_skipped(line):
    outcome = _parse(json.dumps(line))
    if outcome is None:
        return
    assert isinstance(line, dict)
    assert outcome.custom_id == line["custom_id"]
    if isinstance(line["custom_id"], str) and outcome.ok:
        assert isinstance(outcome.text, str)


@SETTINGS
@given(openai_lines, st.integers(0, 400))
def test_a_line_cut_anywhere_is_skipped_or_parsed(line, cut):
    """A corrupt line (the fault plan cuts lines in half) never crashes the parser."""
    outcome = _parse(json.dumps(line)[:cut])
    assert outcome is None or isinstance(outcome, Outcome)




@SETTINGS
@given(st.one_of(openai_lines, json_values))
@example({"custom_id": ["T1"], "response": None, "error": {"code": "batch_expired"}})
@example({"custom_id": "T1", "response": {"status_code": 200, "body": {"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "12"}}}})
def test_every_parsed_openai_outcome_has_its_declared_types(line):
    outcome = _parse(json.dumps(line))
    if outcome is not None:
        well_formed(outcome)


# -- Anthropic results -------------------------------------------------------------------------

ANTHROPIC_SKIPS = (KeyError, TypeError, AttributeError)  # what AnthropicBatchRoute.results skips a line for

anthropic_usage = maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "input_tokens": tokens,
            "output_tokens": tokens,
            "cache_read_input_tokens": tokens,
            "cache_creation_input_tokens": tokens,
        },
    )
)
blocks = st.lists(
    maybe(st.fixed_dictionaries({"type": maybe(st.sampled_from(["text", "thinking", "tool_use"]))}, optional={"text": maybe(st.text(max_size=20))})),
    max_size=3,
)
anthropic_results = st.fixed_dictionaries(
    {"type": maybe(st.sampled_from(["succeeded", "errored", "canceled", "expired"]))},
    optional={
        "message": maybe(
            st.fixed_dictionaries({}, optional={"content": maybe(blocks), "stop_reason": maybe(st.sampled_from(["end_turn", "max_tokens"])), "usage": anthropic_usage})
        ),
        "error": maybe(
            st.fixed_dictionaries(
                {}, optional={"error": maybe(st.fixed_dictionaries({}, optional={"type": maybe(st.sampled_from(["invalid_request_error", "overloaded_error"])), "message": maybe(st.text(max_size=20))}))}
            )
        ),
    },
)


@SETTINGS
@given(st.text(min_size=1, max_size=20), st.one_of(anthropic_results, json_values))
def test_any_anthropic_result_is_an_outcome_for_its_custom_id_or_skipped(custom_id, result):
    try:
        outcome = parse_result(custom_id, result)
    except ANTHROPIC_SKIPS:
        return
    assert outcome.custom_id == custom_id
    assert isinstance(outcome.ok, bool)


@SETTINGS
@given(st.text(min_size=1, max_size=20), anthropic_results)
@example("T1", {"type": "succeeded", "message": {"content": [], "usage": {"input_tokens": "12"}}})
def test_every_parsed_anthropic_outcome_has_its_declared_types(custom_id, result):
    try:
        outcome = parse_result(custom_id, result)
    except ANTHROPIC_SKIPS:
        return
    well_formed(outcome)


# -- job specs --------------------------------------------------------------------------------

GOOD = {
    "name": "tickets",
    "source": {"path": "t.csv", "id_column": "ticket_id"},
    "template": {"user": "Ticket: {{ body }}"},
    "model": "m",
    "route": "echo",
}
KEYS = [*JobSpec.model_fields, "retries", "source.id_colum"]
SECTION_KEYS = {
    "source": ["path", "id_column", "format", "optional_columns", "extra"],
    "template": ["system", "user", "system_file", "user_file", "messages_column", "extra"],
    "params": ["max_tokens", "temperature", "stop", "top_k"],
    "retry": ["max_attempts", "backoff_seconds", "max_backoff_seconds", "jitter"],
    "fallback": ["route", "route_options", "model", "safety_margin", "expected_turnaround", "extra"],
    "output": ["path", "format", "compress"],
}


@st.composite
def spec_mappings(draw):
    """Mostly-right specs with some keys changed, added or removed, at the top and one level down."""
    data = dict(GOOD)
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=4)):
        action = draw(st.sampled_from(["set", "drop", "section"]))
        if action == "drop":
            data.pop(key, None)
        elif action == "section" and key in SECTION_KEYS:
            section = draw(st.dictionaries(st.sampled_from(SECTION_KEYS[key]), json_values, max_size=4))
            data[key] = {**(data.get(key) if isinstance(data.get(key), dict) else {}), **section}
        else:
            data[key] = draw(json_values)
    return data


def names_a_key(problem: str) -> bool:
    return "`" in problem


@SETTINGS
@given(st.one_of(spec_mappings(), st.dictionaries(st.text(max_size=12), json_values, max_size=6)))
def test_any_mapping_builds_a_spec_or_a_spec_error_naming_keys(data):
    try:
        spec = build_spec(data)
    except SpecError as err:
        assert err.problems
        assert all(names_a_key(p) for p in err.problems), err.problems
        return
    assert isinstance(spec, JobSpec)


def test_a_mapping_with_non_string_keys_is_refused_naming_the_key():
    with pytest.raises(SpecError) as info:
        build_spec({**GOOD, 7: "x"})
    assert "`7`: Keys should be strings" in str(info.value)


yaml_text = st.one_of(
    spec_mappings().map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
    st.text(alphabet=string.printable + "é日", max_size=120),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(yaml_text)
def test_any_yaml_text_loads_a_spec_or_a_spec_error_naming_the_file(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        spec = load_spec(path)
    except SpecError as err:
        assert str(err).startswith(str(path)), str(err)
        return
    assert isinstance(spec, JobSpec)


def test_a_spec_file_that_is_not_utf8_is_a_spec_error(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(yaml.safe_dump(GOOD).encode().replace(b"tickets", b"caf\xe9"))
    with pytest.raises(SpecError, match=r"job\.yaml line 2: not UTF-8 text \(byte 0xe9\); save the file as UTF-8"):
        load_spec(path)


def test_a_response_schema_with_an_unresolvable_ref_is_refused():
    with pytest.raises(SpecError, match="response_schema"):
        build_spec({**GOOD, "response_schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}})
