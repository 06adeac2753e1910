"""Eval specs, variant custom_ids, scorers and the report's statistics (core/evals.py,
core/ids.py, core/scoring.py, core/stats.py)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import yaml

from lowtide.core.errors import SpecError
from lowtide.core.evals import ScoringSpec, build_eval, load_eval
from lowtide.core.ids import CUSTOM_ID_PATTERN, custom_id_for
from lowtide.core.scoring import check_expected, field_equal, normalise, scorer
from lowtide.core.stats import accuracy_ci, mcnemar_p, paired_difference_ci


def eval_data(**over) -> dict:
    data = {
        "name": "ev",
        "source": {"path": "t.csv", "id_column": "ticket_id"},
        "template": {"system": "Sort it."},
        "choices": ["billing", "technical"],
        "params": {"max_tokens": 4},
        "variants": {
            "models": [{"name": "a", "model": "m1", "route": "echo"}, {"name": "b", "model": "m2", "route": "echo-batch"}],
            "prompts": [{"name": "p1", "user": "{{ body }}"}, {"name": "p2", "user": "Ticket: {{ body }}"}],
        },
        "scoring": {"method": "choice", "expected": "gold"},
    }
    return data | over


def test_variants_are_models_times_prompts_times_params():
    data = eval_data()
    data["variants"]["params"] = [{"name": "t0", "params": {"temperature": 0}}, {"name": "t1", "params": {"temperature": 1}}]
    ev = build_eval(data)
    assert [m.variant for m in ev.members] == [f"{m}-{p}-{t}" for m in "ab" for p in ("p1", "p2") for t in ("t0", "t1")]
    m = ev.member("b-p2-t1")
    assert (m.spec.name, m.spec.model, m.spec.route, m.spec.variant) == ("ev.b-p2-t1", "m2", "echo-batch", "b-p2-t1")
    assert m.spec.template.user == "Ticket: {{ body }}" and m.spec.template.system == "Sort it."
    assert m.spec.params == {"max_tokens": 4, "temperature": 1}


def test_a_repeated_variant_name_is_refused_naming_both():
    data = eval_data()
    data["variants"]["models"] = [{"name": "a-p1", "model": "m", "route": "echo"}, {"name": "a", "model": "m", "route": "echo"}]
    data["variants"]["prompts"] = [{"name": "x", "user": "{{ body }}"}, {"name": "p1-x", "user": "{{ body }}"}]
    with pytest.raises(SpecError) as err:
        build_eval(data, where="ev.yaml")
    text = str(err.value)
    assert "ev.yaml" in text and "'a-p1-x'" in text and "models[a-p1] × prompts[x]" in text and "unique" in text


def test_a_variant_name_that_does_not_fit_a_custom_id_is_refused():
    data = eval_data()
    data["variants"]["models"][0]["name"] = "m" * 30
    data["variants"]["prompts"][0]["name"] = "p" * 12
    with pytest.raises(SpecError, match=r"at most 40 characters"):
        build_eval(data, where="ev.yaml")


@pytest.mark.parametrize("bad", ["a__b", "a.b", "a b", ""])
def test_a_name_that_cannot_be_in_a_custom_id_is_refused(bad):
    data = eval_data()
    data["variants"]["prompts"][0]["name"] = bad
    with pytest.raises(SpecError, match=r"variants.prompts.0.name"):
        build_eval(data, where="ev.yaml")


def test_a_model_variant_named_judge_is_refused_at_load_naming_file_line_and_fix(tmp_path):
    # Its member job would be EVAL.judge, the judge stage's job: both were paid, then the judge failed.
    data = eval_data(judge={"model": "j", "route": "echo", "user": "{{ output }}"}, scoring={"method": "judge"})
    data["variants"] = {"models": [{"name": "a", "model": "m1", "route": "echo"}, {"name": "judge", "model": "m2", "route": "echo"}]}
    data["template"] = {"system": "Sort it.", "user": "{{ body }}"}
    path = tmp_path / "ev.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpecError) as err:
        load_eval(path)
    text = str(err.value)
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "name: judge" in t)
    assert f"{path} line {line}: variants.models[1].name 'judge' is reserved" in text
    assert "'ev.judge'" in text and "judge stage" in text and "Rename the model variant" in text
    # Without a judge section too (one may be added later); a prompt makes another name, which is fine.
    data.pop("judge"), data.pop("scoring")
    with pytest.raises(SpecError, match="reserved"):
        build_eval(data, where="ev.yaml")
    data["variants"]["prompts"] = [{"name": "p1", "user": "{{ body }}"}]
    assert [m.spec.name for m in build_eval(data).members] == ["ev.a-p1", "ev.judge-p1"]


def test_model_at_the_top_of_an_eval_is_refused_with_the_fix():
    with pytest.raises(SpecError, match=r"`model` belongs to each of variants.models"):
        build_eval(eval_data(model="x"))


def test_choice_scoring_without_choices_and_unknown_json_fields_are_refused():
    data = eval_data()
    del data["choices"]
    with pytest.raises(SpecError, match="needs `choices:`"):
        build_eval(data)
    data = eval_data(response_schema={"type": "object", "properties": {"category": {"type": "string"}}})
    del data["choices"]
    data["scoring"] = {"method": "json_fields", "fields": {"categry": "gold"}}
    with pytest.raises(SpecError, match=r"scoring.fields.categry is not a property"):
        build_eval(data)


def test_variant_custom_ids_are_stable_unique_and_fit():
    rng = random.Random(3)
    keys = [f"T{i}" for i in range(50)] + ["café #12", "x" * 80, "a" * 64, "x" * 79 + "y"]
    keys += ["".join(rng.choice("ab_-.é ") for _ in range(rng.randint(1, 90))) for _ in range(300)]
    keys = list(dict.fromkeys(keys))
    for variant in ("v", "mini-short", "m" * 40):
        ids = [custom_id_for(k, variant) for k in keys]
        assert all(CUSTOM_ID_PATTERN.match(i) and i.endswith("__" + variant) for i in ids)
        assert len(set(ids)) == len(ids)
        assert ids == [custom_id_for(k, variant) for k in keys]
    assert custom_id_for("T1", "a-p1") == "T1__a-p1"
    assert custom_id_for("T1") == "T1"  # jobs without variants keep their ids


def test_exact_normalises_case_space_quotes_and_punctuation():
    score = scorer(ScoringSpec(method="exact", expected="gold"))
    assert score('  "Billing." ', None, "billing") is True
    assert score("Bill ing", None, "billing") is False
    assert score("anything", None, "") is None and score("x", None, None) is None
    assert normalise("Ｂｉｌｌｉｎｇ") == "billing"  # NFKC


def test_regex_numeric_and_fields():
    rx = scorer(ScoringSpec(method="regex", expected="p"))
    assert rx("The answer is 42.", None, r"\b42\b") is True and rx("4200", None, r"\b42\b") is False
    num = scorer(ScoringSpec(method="numeric", expected="n", tolerance=0.03))
    assert num("about 3.14 I think", None, "3.1") is False and num("3.14", None, "3.12") is True and num("none", None, "1") is False
    assert field_equal(True, "true") and not field_equal(False, "true") and field_equal(3, "3.0") and field_equal("Billing", "billing")


def test_check_expected_names_row_column_and_fix():
    where = lambda n: f"t.csv row {n}"  # noqa: E731
    problems = check_expected(ScoringSpec(method="choice", expected="gold"), [(2, "billing"), (3, "shiping"), (4, "")], ["billing", "shipping"], where)
    assert problems == [
        "t.csv row 3: column \"gold\" (scoring.expected) holds 'shiping', which is not one of the choices "
        "(billing, shipping); fix the label, or add it to `choices`"
    ]
    assert "not a regular expression" in check_expected(ScoringSpec(method="regex", expected="p"), [(5, "(")], None, where)[0]
    assert "not a number" in check_expected(ScoringSpec(method="numeric", expected="n"), [(6, "many")], None, where)[0]


@pytest.mark.parametrize("a,b", [(0, 0), (0, 1), (3, 0), (5, 9), (20, 7), (40, 40), (1, 60)])
def test_mcnemar_is_the_exact_two_sided_binomial(a, b):
    n, k = a + b, min(a, b)
    want = min(Fraction(1), 2 * sum(Fraction(math.comb(n, i), 2**n) for i in range(k + 1))) if n else Fraction(1)
    assert mcnemar_p(a, b) == pytest.approx(float(want), rel=1e-9)
    assert mcnemar_p(30000, 30500) > 0  # no overflow on big tables


def test_bootstrap_intervals_are_seeded_and_cover_the_estimate():
    assert accuracy_ci(40, 40) == (1.0, 1.0) and accuracy_ci(0, 0) is None
    lo, hi = accuracy_ci(8, 40)
    assert lo < 0.2 < hi and accuracy_ci(8, 40) == (lo, hi)
    # Against resampling the rows themselves: the same interval to within a couple of points.
    rng = random.Random(1)
    rows = [1] * 8 + [0] * 32
    draws = sorted(sum(rng.choice(rows) for _ in rows) / 40 for _ in range(2000))
    assert abs(draws[50] - lo) <= 0.051 and abs(draws[1949] - hi) <= 0.051
    dlo, dhi = paired_difference_ci(32, 0, 40)
    assert 0.6 < dlo <= 0.8 <= dhi <= 0.95
