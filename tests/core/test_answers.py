"""The answer view against the SDKs' own unions: every chat tool-call type, response output
item and part, and Anthropic content block is either read by core/answers.py or knowingly
left in the stored response, so a type the SDK adds next fails here until it is decided."""

from __future__ import annotations

import typing

import anthropic.types as at
import openai.types.chat as oc
import openai.types.responses as orsp
import pytest
from google.genai import types as gt
from openai.types.responses.response_output_message import Content

from lowtide.core import answers

# Left in `response` only: the provider's own tool runs, and calls that are not function or
# custom tools (shell, computer, patch, MCP), whose shapes have no place in `tool_calls`.
LEFT = {
    "anthropic": {
        "redacted_thinking", "server_tool_use", "web_search_tool_result", "web_fetch_tool_result",
        "code_execution_tool_result", "bash_code_execution_tool_result", "text_editor_code_execution_tool_result",
        "tool_search_tool_result", "container_upload",
    },
    "response items": {
        "file_search_call", "function_call_output", "web_search_call", "computer_call", "computer_call_output",
        "program", "program_output", "tool_search_call", "tool_search_output", "additional_tools", "compaction",
        "image_generation_call", "code_interpreter_call", "local_shell_call", "local_shell_call_output", "shell_call",
        "shell_call_output", "apply_patch_call", "apply_patch_call_output", "mcp_call", "mcp_list_tools",
        "mcp_approval_request", "mcp_approval_response", "custom_tool_call_output",
    },
    "response parts": set(),
    "chat tool calls": set(),
    # Gemini parts that are not the model's text, thoughts or function calls: media, code it
    # ran, tool runs of its own, and metadata.
    "gemini parts": {
        "mediaResolution", "codeExecutionResult", "executableCode", "fileData", "functionResponse", "inlineData",
        "thoughtSignature", "videoMetadata", "toolCall", "toolResponse", "partMetadata", "audioTranscription",
        "mediaProcessing", "speechMetadata", "documentMetadata", "spreadsheetMetadata", "audioMetadata",
    },
}  # fmt: skip


def type_names(union) -> set[str]:
    """The `type` literals of a union of SDK models (Annotated with a discriminator or not)."""
    if typing.get_origin(union) is typing.Annotated:
        union = typing.get_args(union)[0]
    return {name for m in typing.get_args(union) for name in typing.get_args(m.model_fields["type"].annotation)}


@pytest.mark.parametrize(
    ("what", "union", "read"),
    [
        ("anthropic", at.ContentBlock, answers.ANTHROPIC_BLOCKS_READ),
        ("response items", orsp.ResponseOutputItem, answers.RESPONSE_ITEMS_READ),
        ("response parts", Content, answers.RESPONSE_PARTS_READ),
        ("chat tool calls", oc.ChatCompletionMessageToolCallUnion, answers.CHAT_TOOL_CALLS_READ),
    ],
)
def test_every_sdk_type_is_read_or_knowingly_left(what, union, read):
    names = type_names(union)
    undecided = names - read - LEFT[what]
    assert not undecided, f"{what}: the SDK has types core/answers.py neither reads nor leaves: {sorted(undecided)}"
    assert read <= names, f"{what}: read types the SDK no longer has: {sorted(read - names)}"


def test_every_gemini_part_key_is_read_or_knowingly_left():
    names = {f.alias or n for n, f in gt.Part.model_fields.items()}
    undecided = names - answers.GEMINI_PARTS_READ - LEFT["gemini parts"]
    assert not undecided, f"gemini parts: the SDK has keys core/answers.py neither reads nor leaves: {sorted(undecided)}"
    assert names >= answers.GEMINI_PARTS_READ


def test_a_gemini_answer_is_read_candidate_by_candidate():
    # Built with the SDK's own types and dumped to the REST shape Gemini sends (camelCase).
    lp = gt.LogprobsResult(
        chosen_candidates=[gt.LogprobsResultCandidate(token="Hi", log_probability=-0.5)],
        top_candidates=[gt.LogprobsResultTopCandidates(candidates=[gt.LogprobsResultCandidate(token="Hi", log_probability=-0.5),
                                                                   gt.LogprobsResultCandidate(token="Yo", log_probability=-1.5)])],
    )  # fmt: skip
    first = gt.Candidate(
        index=0, finish_reason="STOP", logprobs_result=lp,
        content=gt.Content(role="model", parts=[
            gt.Part(text="thinking it over", thought=True), gt.Part(text="Hi"), gt.Part(text=" there"),
            gt.Part(function_call=gt.FunctionCall(id="f1", name="lookup", args={"q": "café"})),
        ]),
    )  # fmt: skip
    second = gt.Candidate(index=1, finish_reason="MAX_TOKENS", content=gt.Content(role="model", parts=[gt.Part(text="Hey")]))
    body = gt.GenerateContentResponse(candidates=[first, second]).model_dump(mode="json", by_alias=True, exclude_none=True)
    a = answers.read_answer(body)
    assert [c.index for c in a.choices] == [0, 1]
    one = a.first
    assert (one.text, one.reasoning, one.finish_reason) == ("Hi there", "thinking it over", "STOP")
    assert one.tool_calls == [{"id": "f1", "type": "function", "name": "lookup", "arguments": '{"q": "café"}'}]
    assert one.logprobs == [{"token": "Hi", "logprob": -0.5, "bytes": None, "top_logprobs": [
        {"token": "Hi", "logprob": -0.5, "bytes": None}, {"token": "Yo", "logprob": -1.5, "bytes": None}]}]  # fmt: skip
    assert (a.choices[1].text, a.choices[1].finish_reason, a.choices[1].tool_calls) == ("Hey", "MAX_TOKENS", None)
    assert answers.tool_calls(body) == one.tool_calls


def test_a_custom_tool_call_is_read_with_its_free_text():
    call = oc.ChatCompletionMessageCustomToolCall(id="c1", type="custom", custom={"name": "sql", "input": "select 1"})
    message = oc.ChatCompletionMessage(role="assistant", content=None, tool_calls=[call])
    body = oc.ChatCompletion(
        id="x", object="chat.completion", created=1, model="m",
        choices=[oc.chat_completion.Choice(index=0, message=message, finish_reason="tool_calls")],
    ).model_dump(mode="json")  # fmt: skip
    assert answers.tool_calls(body) == [{"id": "c1", "type": "custom", "name": "sql", "arguments": "select 1"}]


@pytest.mark.parametrize("body", [None, {}, {"choices": "x"}, {"choices": [{"message": "odd"}]}, {"output": [1, None]}, {"type": "message", "content": [None]},
                                  {"candidates": [None, {"content": "odd"}, {"content": {"parts": [None, {"functionCall": 3}]}}]},
                                  {"candidates": [{"logprobsResult": {"chosenCandidates": [None], "topCandidates": "x"}}]}])
def test_an_odd_body_reads_as_no_answer_fields_and_never_raises(body):
    first = answers.read_answer(body).first
    assert first.tool_calls is None and first.logprobs is None and answers.tool_calls(body) == []
