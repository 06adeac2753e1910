"""parse_output's choice: a short answer's, remembered by (text, choices), is the one the
long way (`outputs._choice`, compared afresh) gives, and an invalid answer says the same
each time it comes."""

from __future__ import annotations

import pytest

from lowtide.core import outputs
from lowtide.core.native_schema import SHORT_ANSWER
from lowtide.core.outputs import InvalidOutput, parse_output

CHOICES = ["billing", "Technical", "account"]
ANSWERS = [
    "billing", " BILLING \n", "technical", "Technical", '{"choice":"account"}', '{"choice": " Account "}',
    '{"choice":"nope"}', "refund", "", "{not json", '{"choice": 1}', "billing, I think", "x" * (SHORT_ANSWER + 5),
]


def _long_way(text: str, choices: list[str]) -> str:
    try:
        return outputs._choice(text, choices)
    except InvalidOutput as err:
        return f"invalid: {err}"


def _short_way(text: str, choices) -> str:
    try:
        return parse_output(text, None, choices)
    except InvalidOutput as err:
        return f"invalid: {err}"


@pytest.mark.parametrize("text", ANSWERS)
def test_a_remembered_choice_is_the_one_compared_afresh(text):
    for _ in range(2):  # the second time from the cache, where it is kept
        assert _short_way(text, CHOICES) == _long_way(text, CHOICES)
        assert _short_way(text, tuple(CHOICES)) == _long_way(text, CHOICES)


def test_the_same_text_under_other_choices_is_compared_with_those():
    assert parse_output("billing", None, ["billing", "account"]) == "billing"
    with pytest.raises(InvalidOutput, match="is not one of the choices: account, refund"):
        parse_output("billing", None, ["account", "refund"])
    assert parse_output("ACCOUNT", None, ["Account"]) == "Account"
    assert parse_output("ACCOUNT", None, ["account"]) == "account"
