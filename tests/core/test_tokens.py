"""Input-token counting: the documented approximation, and tiktoken only when it needs no network."""

from __future__ import annotations

import hashlib
import sys
import types

import pytest

from lowtide.core import tokens
from lowtide.core.tokens import APPROXIMATION, approx_tokens, counter_for, encoding_for


# ASCII: characters / 4, rounded up; each UTF-8 byte past a character's first adds half a
# token ("é" takes two bytes, "注" three): tests/core/test_token_approximation.py says why.
@pytest.mark.parametrize(("text", "n"), [("", 0), ("abc", 1), ("abcd", 1), ("abcde", 2), ("é" * 8, 6), ("注" * 4, 5)])
def test_the_approximation_is_characters_over_four_rounded_up_and_more_outside_ascii(text, n):
    assert approx_tokens(text) == n


def test_messages_add_three_per_message_and_three_for_the_reply():
    counter = counter_for("claude-haiku-4-5", "anthropic")
    messages = [{"role": "system", "content": "abcd"}, {"role": "user", "content": "abcdefgh"}]
    # (1 + 3) + (2 + 3) + 3
    assert counter.count_messages(messages) == 12
    assert not counter.exact and counter.method.startswith(APPROXIMATION)


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("claude-sonnet-4", None),
        ("smollm2-135m-instruct", None),
    ],
)
def test_openai_models_map_to_their_encoding(model, encoding):
    assert encoding_for(model) == encoding


def test_without_tiktoken_openai_models_are_approximated(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import fails
    counter = counter_for("gpt-4o-mini", "openai")
    assert not counter.exact and "tiktoken is not installed" in counter.method


@pytest.fixture
def fake_tiktoken(monkeypatch):
    """A tiktoken that fails the test if lowtide asks it for an encoding (it would download)."""
    module = types.ModuleType("tiktoken")

    def get_encoding(name):
        raise AssertionError(f"tiktoken.get_encoding({name!r}) called: it would download")

    module.get_encoding = get_encoding
    monkeypatch.setitem(sys.modules, "tiktoken", module)
    return module


def test_tiktoken_without_its_cached_file_is_never_asked(fake_tiktoken, tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    counter = counter_for("gpt-4o", "openai")
    assert not counter.exact and "not in its cache" in counter.method and "never downloads" in counter.method


def test_tiktoken_with_its_cache_turned_off_is_never_asked(fake_tiktoken, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert "turned off" in counter_for("gpt-4o", "openai").method


def test_a_cached_file_with_a_wrong_checksum_is_not_used(fake_tiktoken, tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    url, _ = tokens._ENCODINGS["o200k_base"]
    (tmp_path / hashlib.sha1(url.encode()).hexdigest()).write_bytes(b"truncated")
    assert "fails its checksum" in counter_for("gpt-4o", "openai").method


def test_tiktoken_cache_dir_follows_tiktoken(monkeypatch, tmp_path):
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(tmp_path))
    assert tokens.tiktoken_cache_dir() == tmp_path
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "t"))
    assert tokens.tiktoken_cache_dir() == tmp_path / "t"


def test_exact_counts_when_tiktoken_works_offline():
    counter = counter_for("gpt-4o", "openai")
    if not counter.exact:
        pytest.skip(f"no offline tiktoken here: {counter.method}")
    assert counter.count_text("hello world") == 2
    assert counter.count_messages([{"role": "user", "content": "hello world"}]) == 2 + 3 + 3
