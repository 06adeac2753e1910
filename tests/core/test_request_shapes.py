"""Conversations (`messages_column`) and `params` values, checked against the SDKs' own types.

The cases are generated from the types (every role, every content part type, every body
key), so a role, part or parameter the SDKs add is covered the day they ship it.
"""

from __future__ import annotations

import copy
import typing

import pytest

from lowtide.core import shapes
from lowtide.core.conversations import check, conversation_type
from lowtide.core.endpoints import CHAT, MESSAGES, NEVER, RESPONSES, body_type
from lowtide.core.params import check_values
from lowtide.core.spec import check_params, template_keys
from tests.core.sdk_instances import minimal, tagged_members

ENDPOINTS = (CHAT, RESPONSES, MESSAGES)


def message_type(endpoint: str):
    """The SDK's type of one message (input item) of `endpoint`'s conversation."""
    lists = [a for a in shapes.arms(conversation_type(endpoint)) if shapes.said(a) == "a list"]
    return typing.get_args(shapes.unwrap(lists[0]))[0]


def name():
    return "c.jsonl row 4"


def refused(value, endpoint: str = CHAT) -> str:
    with pytest.raises(ValueError) as info:
        check(value, endpoint, "conv", name)
    return str(info.value)


CASES = [(e, role, td) for e in ENDPOINTS for role, td in tagged_members(message_type(e), "role").items()]


@pytest.mark.parametrize(("endpoint", "role", "td"), CASES, ids=[f"{e}-{r}" for e, r, _ in CASES])
def test_every_role_the_sdk_declares_is_taken_verbatim(endpoint, role, td):
    message = minimal(td)
    conversation = [message, {"role": "user", "content": "and?"}]
    kept = copy.deepcopy(conversation)
    assert check(conversation, endpoint, "conv", name) == kept


def user_parts(endpoint: str) -> dict[str, type]:
    user = tagged_members(message_type(endpoint), "role")["user"]
    content = shapes.fields(user)["content"][0]
    items = [a for a in shapes.arms(content) if shapes.said(a) == "a list"][0]
    return tagged_members(typing.get_args(shapes.unwrap(items))[0], "type")


PART_CASES = [(e, t, td) for e in ENDPOINTS for t, td in user_parts(e).items()]


@pytest.mark.parametrize(("endpoint", "kind", "td"), PART_CASES, ids=[f"{e}-{t}" for e, t, _ in PART_CASES])
def test_every_user_content_part_type_is_taken_verbatim(endpoint, kind, td):
    part = minimal(td)
    conversation = [{"role": "user", "content": [{"type": "input_text" if endpoint == RESPONSES else "text", "text": "see"}, part]}]
    assert check(copy.deepcopy(conversation), endpoint, "conv", name) == conversation


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_part_type_the_sdk_does_not_declare_names_row_message_and_part(endpoint):
    text = "input_text" if endpoint == RESPONSES else "text"
    msg = refused([{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": text, "text": "a"}, {"type": "video_url"}]}], endpoint)
    assert msg.startswith('c.jsonl row 4: column "conv" message 2, part 2 (')
    assert "'video_url' is not one of" in msg and sorted(user_parts(endpoint))[0] in msg
    assert f"the cell must hold a list of {endpoint} messages" in msg


def test_a_part_a_role_does_not_take_is_refused():
    # Chat completions: a system message holds text parts only.
    msg = refused([{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}])
    assert "message 1, part 1 (messages[0].content[0].type): 'image_url' is not one of text" in msg


def test_tool_history_needs_its_ids():
    msg = refused([{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}])
    assert "message 2 (messages[1]): `tool_call_id` is required" in msg
    msg = refused([{"role": "user", "content": [{"type": "tool_result", "content": "42"}]}], MESSAGES)
    assert "message 1, part 1 (messages[0].content[0]): `tool_use_id` is required" in msg


def test_unknown_message_keys_and_roles_are_named():
    assert "message 1 (messages[0].role): 'robot' is not one of" in refused([{"role": "robot", "content": "x"}])
    msg = refused([{"role": "user", "content": "x", "cache_control": {"type": "ephemeral"}}])
    assert "(messages[0].cache_control): not a field here; the fields are: content, role, name" in msg
    assert "is not JSON" in refused("[{role: user}]")
    assert "must be a non-empty list" in refused([])


def test_plain_text_turns_stay_the_fast_case():
    turns = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert check(turns, CHAT, "conv", name) is turns


# params ---------------------------------------------------------------------------------

# Keys whose value must relate to another key (tool_choice names a tool): checked below.
RELATED = {"tool_choice"}
KEY_CASES = [
    (e, key) for e in ENDPOINTS for key in sorted(shapes.fields(body_type(e))) if key not in template_keys(e) | NEVER | RELATED
]


@pytest.mark.parametrize(("endpoint", "key"), KEY_CASES, ids=[f"{e}-{k}" for e, k in KEY_CASES])
def test_every_parameter_the_sdk_declares_takes_a_value_of_its_type(endpoint, key):
    value = minimal(shapes.fields(body_type(endpoint))[key][0])
    assert check_params({key: value}, endpoint) == {key: value}


@pytest.mark.parametrize(("endpoint", "key"), [(e, k) for e, k in KEY_CASES if shapes.scalar(shapes.fields(body_type(e))[k][0]) in (int, float, bool)])
def test_a_scalar_parameter_of_the_wrong_type_is_refused(endpoint, key):
    with pytest.raises(ValueError, match=rf"^{key}: must be .*, not text \(the SDK's type for {endpoint} `{key}`\); fix the value"):
        check_values({key: "hot"}, endpoint)


def chat_tool(name: str, parameters) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def test_a_tool_whose_parameters_are_not_a_json_schema_is_refused():
    with pytest.raises(ValueError, match=r"tools\[1\]\.function\.parameters: not a valid JSON Schema: .*fix the tool's schema"):
        check_params({"tools": [chat_tool("a", {"type": "object"}), chat_tool("b", {"type": "objekt"})]}, CHAT)
    with pytest.raises(ValueError, match=r"tools\[0\]\.input_schema: not a valid JSON Schema"):
        check_params({"max_tokens": 5, "tools": [{"name": "a", "input_schema": {"type": "object", "required": "x"}}]}, MESSAGES)
    with pytest.raises(ValueError, match=r'tools\[0\]\.parameters: not a valid JSON Schema: \$ref "#/\$defs/x" does not resolve'):
        check_params({"tools": [{"type": "function", "name": "a", "parameters": {"$ref": "#/$defs/x"}, "strict": True}]}, RESPONSES)


def test_tool_choice_must_name_a_tool_that_exists():
    tools = [chat_tool("lookup", {"type": "object"})]
    assert check_params({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "lookup"}}}, CHAT)
    with pytest.raises(ValueError, match=r'tool_choice: names the tool "lookpu", but the tools are: lookup; fix the name'):
        check_params({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "lookpu"}}}, CHAT)
    with pytest.raises(ValueError, match=r"tool_choice: 'required' asks for a tool, but params has no `tools`"):
        check_params({"tool_choice": "required"}, CHAT)
    with pytest.raises(ValueError, match=r'names the tool "b"'):
        check_params({"max_tokens": 5, "tools": [{"name": "a", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "b"}}, MESSAGES)
    # Per-row tools (param_columns) are checked with each row.
    assert check_params({"tool_choice": "required"}, CHAT, per_row=frozenset({"tools"}))


def test_a_json_schema_response_format_needs_a_valid_schema():
    good = {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object"}}}
    assert check_params({"response_format": good}, CHAT)
    bad = {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": 5}}}
    with pytest.raises(ValueError, match=r"response_format\.json_schema\.schema: not a valid JSON Schema"):
        check_params({"response_format": bad}, CHAT)
    with pytest.raises(ValueError, match=r"text\.format\.schema: not a valid JSON Schema"):
        check_params({"text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": 5}}}}, RESPONSES)
    with pytest.raises(ValueError, match=r"response_format: `json_schema` is required"):
        check_params({"response_format": {"type": "json_schema"}}, CHAT)


def test_n_must_be_positive():
    assert check_params({"n": 3}, CHAT) == {"n": 3}
    with pytest.raises(ValueError, match=r"n: 0 choices asked; .*1 or more"):
        check_params({"n": 0}, CHAT)
    with pytest.raises(ValueError, match=r"n: must be an integer or null, not a number"):
        check_params({"n": 1.5}, CHAT)
