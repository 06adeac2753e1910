"""custom_id: valid keys are used as they are; any other key maps deterministically."""

from __future__ import annotations

import hashlib
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.ids import CUSTOM_ID_PATTERN, custom_id_for

PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
SAFE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
valid_keys = st.text(alphabet=SAFE, min_size=1, max_size=64)
any_keys = st.text(max_size=200)  # hypothesis text: any code point but lone surrogates


def test_pattern_is_the_strictest_providers_rule():
    assert CUSTOM_ID_PATTERN.pattern == PATTERN.pattern


@given(any_keys)
@settings(max_examples=500)
def test_output_always_matches_the_pattern(key):
    assert PATTERN.match(custom_id_for(key))


@given(any_keys)
def test_deterministic(key):
    assert custom_id_for(key) == custom_id_for("".join(list(key)))  # an equal copy, same id


@given(valid_keys)
def test_valid_keys_are_unchanged(key):
    assert custom_id_for(key) == key


@given(any_keys.filter(lambda k: not PATTERN.match(k)))
def test_invalid_keys_get_a_readable_prefix_and_their_hash(key):
    cid = custom_id_for(key)
    prefix, digest = cid.rsplit("-", 1)
    assert digest == hashlib.sha1(key.encode("utf-8")).hexdigest()[:8]
    assert 1 <= len(prefix) <= 55


@given(st.lists(any_keys, min_size=2, max_size=50, unique=True))
@settings(max_examples=200)
def test_different_keys_get_different_ids_in_practice(keys):
    assert len({custom_id_for(k) for k in keys}) == len(keys)


def test_keys_that_differ_only_in_unsafe_characters_stay_distinct():
    keys = ["a b", "a#b", "a/b", "a  b", "a\tb", "a_b", "aéb", "a😀b"]
    ids = [custom_id_for(k) for k in keys]
    assert len(set(ids)) == len(keys)
    assert ids[5] == "a_b"  # valid: kept
    assert all(i.startswith("a_b-") for i in ids[:5] + ids[6:])


def test_documented_examples():
    digest = hashlib.sha1("café #12".encode()).hexdigest()[:8]
    assert custom_id_for("café #12") == f"caf_12-{digest}"
    assert custom_id_for("ticket-48213") == "ticket-48213"
    assert custom_id_for("###").startswith("id-")  # nothing readable is left
    assert custom_id_for("").startswith("id-")
    assert custom_id_for("日本語") == "id-" + hashlib.sha1("日本語".encode()).hexdigest()[:8]


def test_length_limits():
    assert custom_id_for("x" * 64) == "x" * 64
    long = custom_id_for("x" * 65)
    assert len(long) == 64 and long.startswith("x" * 55 + "-")
    assert custom_id_for("x" * 65) != custom_id_for("x" * 66)
    assert len(custom_id_for("é" * 500)) <= 64
