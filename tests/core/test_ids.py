"""custom_id: valid keys are used as they are; any other key maps deterministically."""

from __future__ import annotations

import hashlib
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.ids import (
    CUSTOM_ID_PATTERN,
    custom_id_for,
    custom_id_of,
    key_of,
    legacy_custom_ids,
)

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
    assert digest == hashlib.sha1(key.encode("utf-8")).hexdigest()[:16]
    assert 1 <= len(prefix) <= 47


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
    digest = hashlib.sha1("café #12".encode()).hexdigest()[:16]
    assert custom_id_for("café #12") == f"caf_12-{digest}"
    assert custom_id_for("ticket-48213") == "ticket-48213"
    assert custom_id_for("###").startswith("id-")  # nothing readable is left
    assert custom_id_for("").startswith("id-")
    assert custom_id_for("日本語") == "id-" + hashlib.sha1("日本語".encode()).hexdigest()[:16]


def test_length_limits():
    assert custom_id_for("x" * 64) == "x" * 64
    long = custom_id_for("x" * 65)
    assert len(long) == 64 and long.startswith("x" * 47 + "-")
    assert custom_id_for("x" * 65) != custom_id_for("x" * 66)
    assert len(custom_id_for("é" * 500)) <= 64


def _sha1(key: str, digits: int) -> str:
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:digits]


# Two URLs of one long prefix were told apart by 8 hex digits alone (32 bits): in one job in
# four of 50,000 such keys two got one custom_id, and the load refused them as a duplicate.
PHONES = "https://shop.example.com/catalog/electronics/phones/product?id="
PAIR = (PHONES + "32403", PHONES + "176634")


def test_keys_of_a_long_shared_prefix_are_told_apart_by_64_bits():
    a, b = (custom_id_for(k) for k in PAIR)
    assert a != b
    assert a == "https_shop_example_com_catalog_electronics_phon-" + _sha1(PAIR[0], 16)
    assert all(PATTERN.match(c) for c in (a, b))


def test_a_mapped_key_names_its_8_digit_id_as_legacy():
    # what stores from before the 16-digit hash hold: that pair shared one id then
    old = "https_shop_example_com_catalog_electronics_phones_produ-1e6fc8d4"
    assert [legacy_custom_ids(k) for k in PAIR] == [[old], [old]]
    assert legacy_custom_ids("café #12") == ["caf_12-" + _sha1("café #12", 8)]
    assert legacy_custom_ids("ticket-48213") == []  # used as it is, then as now
    assert legacy_custom_ids("1.0") == ["1_0-" + _sha1("1.0", 8)]  # the float spelling's, 8 digits then


def test_a_variants_legacy_id_keeps_the_variant():
    variant, room = "gpt-v2", 64 - len("__gpt-v2")
    assert custom_id_for("x" * room, variant) == "x" * room + "__gpt-v2"  # fits beside it: kept
    assert legacy_custom_ids("x" * room, variant) == []
    long = "y" * (room + 1)
    assert custom_id_for(long, variant) == "y" * (room - 17) + "-" + _sha1(long, 16) + "__gpt-v2"
    assert legacy_custom_ids(long, variant) == ["y" * (room - 9) + "-" + _sha1(long, 8) + "__gpt-v2"]


@given(st.one_of(valid_keys, any_keys, st.sampled_from(["1.0", "-7.00", "a" * 64, "a" * 65, "٣", "é1", "ab c"])),
       st.one_of(st.none(), st.sampled_from(["v2", "gpt-4o_mini"])))  # fmt: skip
def test_custom_id_of_is_custom_id_for_of_key_of(text, variant):
    """The loader's short way (an id of ASCII letters and digits is its own) equals the long way."""
    assert custom_id_of(text, variant) == custom_id_for(key_of(text), variant)
