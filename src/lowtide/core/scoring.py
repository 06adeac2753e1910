"""Scoring one answer against its expected value (docs/evals.md "Scoring").

A scorer returns True (correct), False (wrong) or None (not scored: the row has no expected
value, which is never counted as wrong). `check_expected` refuses, before anything is sent,
expected values the method cannot use: a label outside the choices, a pattern that is not a
regular expression, a number that is not a number; each names the file, row, column and fix.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from lowtide.core.evals import ScoringSpec

_SPACE = re.compile(r"\s+")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:[.,]\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_EDGE = "\"'`.,;:!?()[]{}* "


def normalise(value: Any) -> str:
    """Text as an exact-match compares it: Unicode NFKC, case-folded, spaces collapsed,
    quotes and trailing punctuation off (`"Billing."` equals `billing`)."""
    if value is None:
        return ""
    if value.__class__ is str:
        return _normalise_text(value)
    return _normalise_text(json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else str(value))


@lru_cache(maxsize=1 << 16)  # answers and labels repeat across rows and variants
def _normalise_text(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    return _SPACE.sub(" ", text).strip(_EDGE)


def is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str) and not value.strip())


def first_number(text: Any) -> float | None:
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    m = _NUMBER.search(str(text or ""))
    return float(m.group().replace(",", ".")) if m else None


Scorer = Callable[[Any, Any, Any], "bool | None"]  # (output, parsed answer, expected) -> verdict


def scorer(spec: ScoringSpec) -> Scorer:
    """The scoring function of a method (json_fields and judge are scored elsewhere)."""
    if spec.method in ("exact", "choice"):
        return lambda out, _parsed, exp: None if is_missing(exp) else normalise(out) == normalise(exp)
    if spec.method == "regex":
        flags = re.IGNORECASE if spec.ignore_case else 0
        cache: dict[str, re.Pattern] = {}

        def by_pattern(out: Any, _parsed: Any, exp: Any) -> bool | None:
            if is_missing(exp):
                return None
            pattern = cache.get(exp) or cache.setdefault(exp, re.compile(str(exp), flags))
            return pattern.search(str(out or "")) is not None

        return by_pattern
    if spec.method == "numeric":

        def by_number(out: Any, _parsed: Any, exp: Any) -> bool | None:
            if is_missing(exp):
                return None
            got, want = first_number(out), first_number(exp)
            return got is not None and want is not None and abs(got - want) <= spec.tolerance + 1e-12

        return by_number
    raise ValueError(f"no plain scorer for {spec.method}")


def field_equal(got: Any, want: Any) -> bool:
    """A JSON answer's field against a cell: numbers as numbers, anything else normalised
    (a CSV cell `true` equals the JSON `true`)."""
    if isinstance(got, int | float) and not isinstance(got, bool):
        w = first_number(want)
        return w is not None and abs(float(got) - w) <= 1e-9
    if isinstance(got, bool):
        return normalise(want) in (("true", "1", "yes") if got else ("false", "0", "no"))
    return normalise(got) == normalise(want)


def check_expected(spec: ScoringSpec, values: Any, choices: list[str] | None, where: Callable[[int], str]) -> list[str]:
    """Problems with the expected column: `values` is (row, value) pairs, `where(row)` names a row."""
    column = spec.expected
    problems: list[str] = []
    allowed = {normalise(c): c for c in choices or []}
    for number, value in values:
        if is_missing(value):
            continue
        if spec.method == "choice" and normalise(value) not in allowed:
            problems.append(
                f'{where(number)}: column "{column}" (scoring.expected) holds {value!r}, which is not one of the choices '
                f"({', '.join(choices or [])}); fix the label, or add it to `choices`"
            )
        elif spec.method == "regex":
            try:
                re.compile(str(value))
            except re.error as err:
                problems.append(f'{where(number)}: column "{column}" (scoring.expected) is not a regular expression ({err}); fix the pattern')
        elif spec.method == "numeric" and first_number(value) is None:
            problems.append(f'{where(number)}: column "{column}" (scoring.expected) holds {value!r}, which is not a number; fix the cell')
        if len(problems) >= 50:
            break
    return problems
