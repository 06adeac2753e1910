"""echo remembers jsonschema's verdict on each distinct value it made (`Instances._valid`):
values JSON or Python equality would confuse (1, True, 1.0; NaN and null) keep verdicts of
their own, and what `make` returns is still valid, seed by seed."""

from __future__ import annotations

import jsonschema

from lowtide.routes.own.instances import Instances, instances_for


def test_values_that_compare_equal_keep_their_own_verdicts():
    integers = Instances({"type": "integer"})
    assert integers._valid(1) is True
    assert integers._valid(True) is False  # 1 == True, and hash(1) == hash(True)
    assert integers._valid(1.0) is True  # 2020-12: an integral number is an integer
    assert integers._valid(1.5) is False
    null = Instances({"type": "null"})
    assert null._valid(None) is True
    assert null._valid(float("nan")) is False  # orjson would write it as null too
    assert null._valid("None") is False


def test_what_make_returns_is_valid_for_every_seed_with_verdicts_remembered():
    schema = {"type": "object", "additionalProperties": False, "required": ["label", "urgent", "note"],
              "properties": {"label": {"enum": ["billing", "technical", "account"]}, "urgent": {"type": "boolean"},
                             "note": {"type": "string", "maxLength": 6}}}  # fmt: skip
    made = instances_for(schema)
    check = jsonschema.Draft202012Validator(schema)
    values = [made.make(seed) for seed in range(3000)]
    assert all(check.is_valid(v) for v in values)
    assert values == [Instances(schema).make(seed) for seed in range(3000)]  # the same as made afresh
    assert len({repr(v) for v in values}) > 6  # not all one value
