"""A spec rebuilt from the store (core/spec.py `rebuilt_from_store`) is not checked against the
SDK's types again: it passed that check when it was stored, and the check imports the openai
package. Everything else about the spec is read as before; specs from a file or the API are
checked in full, before and after such a block."""

from __future__ import annotations

import pytest

from lowtide.core.endpoints import GEMINI
from lowtide.core.errors import SpecError
from lowtide.core.spec import build_spec, rebuilt_from_store

BASE = {"name": "j", "source": {"path": "t.csv", "id_column": "id"}, "template": {"user": "{{ body }}"},
        "model": "gpt-4o-mini", "route": "echo", "base_dir": "."}  # fmt: skip


def test_a_spec_from_a_file_or_the_api_is_checked_against_the_sdk():
    with pytest.raises(SpecError, match='"max_tokenz" is not a parameter of /v1/chat/completions'):
        build_spec({**BASE, "params": {"max_tokenz": 8}})
    with pytest.raises(SpecError, match="temperature"):
        build_spec({**BASE, "params": {"temperature": "hot"}})


def test_a_spec_rebuilt_from_the_store_keeps_its_params_as_stored():
    with rebuilt_from_store():
        spec = build_spec({**BASE, "params": {"max_tokens": 8, "temperature": None, "seed": 3}, "param_columns": {"top_p": "p"}})
    assert spec.params == {"max_tokens": 8, "seed": 3}  # a null value still sets nothing
    assert spec.param_columns == {"top_p": "p"}


def test_the_rest_of_a_rebuilt_spec_is_still_read():
    with rebuilt_from_store(), pytest.raises(SpecError, match="max_tokens is required by /v1/messages"):
        build_spec({**BASE, "route": "anthropic-batch", "params": {"temperature": 0}})


def test_gemini_snake_case_keys_are_still_read_as_camel_case():
    data = {**BASE, "route": "gemini-batch", "endpoint": GEMINI, "template": {"body_column": "body"},
            "params": {"generation_config": {"max_output_tokens": 5}}}  # fmt: skip
    with rebuilt_from_store():
        rebuilt = build_spec(data)
    assert rebuilt.params == build_spec(data).params == {"generationConfig": {"maxOutputTokens": 5}}


def test_the_block_ends_with_its_with():
    with rebuilt_from_store():
        build_spec({**BASE, "params": {"max_tokenz": 8}})
    with pytest.raises(SpecError, match="max_tokenz"):
        build_spec({**BASE, "params": {"max_tokenz": 8}})
