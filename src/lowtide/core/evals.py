"""The eval spec: one file, many variants (docs/evals.md).

An eval spec is a job spec without `model`/`route` (a variant brings them) plus:

    variants:
      models:   [{name, model, route, route_options}]      # at least one
      prompts:  [{name, system | system_file, user | user_file}]   # default: the spec's template
      params:   [{name, params}]                            # optional parameter sets
    scoring:  {method, expected, fields, tolerance, ignore_case}
    judge:    {model, route, route_options, system, user, verdict_schema, verdict_field, params}

Every (model × prompt × parameter set) is a *variant*, named `model-prompt[-params]`, and runs
as one member job named `EVAL.VARIANT` with its own custom_ids (`KEY__VARIANT`, core/ids.py).
A member is an ordinary job: batch routes split by model because each member has one model,
members are resumable and incremental like any job, and adding a variant adds a member
without touching the stored spec of any other (so nothing is reported as changed).

The judge is a second stage: a job (`EVAL.judge`) whose rows are the first stage's answers
(engine/stages.py), scored by the verdict it returns. Its name is reserved: a variant named
`judge` would be the same job, so it is refused (STAGES).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lowtide.core.errors import SpecError
from lowtide.core.ids import MAX_VARIANT, VARIANT_NAME, VARIANT_SEPARATOR
from lowtide.core.spec import JOB_NAME, JobSpec, build_spec
from lowtide.core.yamlfile import Lines, parse_mapping, read_text, validate

EVAL_KEYS = ("variants", "scoring", "judge")
METHODS = ("exact", "choice", "json_fields", "regex", "numeric", "judge")
# Columns a judge row has beside the source's own (engine/stages.py writes them).
STAGE_COLUMNS = ("row_id", "key", "variant", "model", "prompt", "output", "answer", "expected")
# Variant names an eval keeps for its own stages: member `EVAL.judge` would be the judge's job.
STAGES = ("judge",)
DEFAULT_VERDICT = {
    "type": "object",
    "properties": {"correct": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["correct", "reason"],
    "additionalProperties": False,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Named(_Strict):
    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not VARIANT_NAME.match(v) or VARIANT_SEPARATOR in v:
            raise ValueError(f"{v!r}: use letters, digits, '-' or single '_' (names become part of custom_ids)")
        return v


class ModelVariant(_Named):
    model: str
    route: str
    route_options: dict[str, Any] = Field(default_factory=dict)


class PromptVersion(_Named):
    system: str | None = None
    user: str | None = None
    system_file: str | None = None
    user_file: str | None = None

    def template(self) -> dict[str, Any]:
        return {k: v for k in ("system", "user", "system_file", "user_file") if (v := getattr(self, k)) is not None}


class ParamSet(_Named):
    params: dict[str, Any]


class VariantsSpec(_Strict):
    models: list[ModelVariant] = Field(min_length=1)
    prompts: list[PromptVersion] = Field(default_factory=list)
    params: list[ParamSet] = Field(default_factory=list)


class ScoringSpec(_Strict):
    method: Literal["exact", "choice", "json_fields", "regex", "numeric", "judge"]
    # The column with the expected answer (for regex: the pattern the answer must match).
    expected: str | None = None
    # json_fields: {schema property: column holding its expected value}.
    fields: dict[str, str] = Field(default_factory=dict)
    tolerance: float = Field(0.0, ge=0)  # numeric: |answer - expected| allowed
    ignore_case: bool = True  # regex

    @model_validator(mode="after")
    def _needs(self) -> ScoringSpec:
        if self.method == "json_fields":
            if not self.fields:
                raise ValueError("json_fields scoring needs `fields: {property: expected column}`")
        elif self.expected is None and self.method != "judge":
            raise ValueError(f"{self.method} scoring needs `expected:` (the column with the expected answer)")
        return self


class JudgeSpec(_Strict):
    model: str
    route: str
    route_options: dict[str, Any] = Field(default_factory=dict)
    system: str | None = None
    user: str
    verdict_schema: dict[str, Any] = Field(default_factory=lambda: dict(DEFAULT_VERDICT))
    verdict_field: str = "correct"  # the boolean property of the verdict that scores a row
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _field(self) -> JudgeSpec:
        if self.verdict_field not in (self.verdict_schema.get("properties") or {}):
            raise ValueError(f"verdict_field {self.verdict_field!r} is not a property of verdict_schema; add it (a boolean)")
        return self


class EvalParts(_Strict):
    variants: VariantsSpec
    scoring: ScoringSpec | None = None
    judge: JudgeSpec | None = None

    @model_validator(mode="after")
    def _judge(self) -> EvalParts:
        if self.scoring is not None and self.scoring.method == "judge" and self.judge is None:
            raise ValueError("scoring.method judge needs a `judge:` section (model, route, user template)")
        return self


@dataclass(frozen=True, slots=True)
class Member:
    """One variant of an eval, as the job that runs it."""

    variant: str
    model_name: str
    prompt: str | None
    param_set: str | None
    spec: JobSpec


@dataclass(frozen=True, slots=True)
class EvalSpec:
    name: str
    data: dict[str, Any]  # the spec as given (base_dir added): kept in the store
    parts: EvalParts
    members: tuple[Member, ...]
    where: str

    @property
    def base(self) -> JobSpec:
        return self.members[0].spec

    @property
    def scoring(self) -> ScoringSpec | None:
        return self.parts.scoring

    @property
    def judge_name(self) -> str:
        return member_job_name(self.name, "judge")

    def member(self, variant: str) -> Member:
        return next(m for m in self.members if m.variant == variant)


def member_job_name(eval_name: str, variant: str) -> str:
    """`EVAL.VARIANT`, or, past a job name's 64 characters, cut and given a hash."""
    name = f"{eval_name}.{variant}"
    if len(name) <= 64:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{name[:55]}-{digest}"


def is_eval_data(data: dict[str, Any]) -> bool:
    return "variants" in data


def is_eval_file(path: str | Path) -> bool:
    """Whether a spec file is an eval spec (it has `variants:`), without validating it."""
    try:
        data, _ = parse_mapping(read_text(Path(path), "job spec"), str(path), "a spec is a YAML mapping")
    except SpecError:
        return False  # the job loader reports it
    return is_eval_data(data)


def load_eval(path: str | Path) -> EvalSpec:
    path = Path(path)
    data, lines = parse_mapping(read_text(path, "eval spec"), str(path), "an eval spec is a YAML mapping")
    data.setdefault("base_dir", str(path.parent.resolve()))
    return build_eval(data, where=str(path), lines=lines)


def build_eval(data: dict[str, Any], where: str = "eval spec", lines: Lines | None = None) -> EvalSpec:
    """The eval and its member job specs; every problem names the file, line, key and fix."""
    name = data.get("name")
    if not isinstance(name, str) or not JOB_NAME.match(name):
        raise SpecError(f"{where}: `name` must be 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit")
    for key in ("model", "route", "route_options"):
        if key in data:
            raise SpecError(f"{where} line {(lines or {}).get((key,), '?')}: `{key}` belongs to each of variants.models in an eval spec; move it there")
    parts = validate(EvalParts, {k: data[k] for k in EVAL_KEYS if k in data}, where, "eval spec", lines)
    base = {k: v for k, v in data.items() if k not in EVAL_KEYS}
    v = parts.variants
    combos = [(i, m, p, s) for i, m in enumerate(v.models) for p in (v.prompts or [None]) for s in (v.params or [None])]
    seen: dict[str, str] = {}
    members = []
    for i, m, p, s in combos:
        variant = "-".join(x.name for x in (m, p, s) if x is not None)
        said = f"variants: models[{m.name}]" + (f" × prompts[{p.name}]" if p else "") + (f" × params[{s.name}]" if s else "")
        if variant in STAGES:  # only a model's name alone makes one: a prompt or params adds "-…"
            line = (lines or {}).get(("variants", "models", str(i), "name"))
            raise SpecError(
                f"{where}{f' line {line}' if line else ''}: variants.models[{i}].name {variant!r} is reserved: member job "
                f"{member_job_name(name, variant)!r} would be the eval's {variant} stage, and the two would clash. "
                f"Rename the model variant (e.g. {variant}-model)"
            )
        if variant in seen:
            raise SpecError(
                f"{where}: {said} and {seen[variant]} are both named variant {variant!r}; "
                "variant names must be unique: rename a model, prompt or parameter set"
            )
        if len(variant) > MAX_VARIANT:
            raise SpecError(
                f"{where}: {said} makes variant name {variant!r} ({len(variant)} characters); it must fit a custom_id "
                f"beside the row's key: at most {MAX_VARIANT} characters. Use shorter names"
            )
        seen[variant] = said
        member = dict(base, name=member_job_name(name, variant), model=m.model, route=m.route, route_options=m.route_options, variant=variant)
        if p is not None:
            # A prompt version replaces the parts it gives (its system, its user), no others.
            template = dict(base.get("template") or {})
            given = p.template()
            for role in ("system", "user"):
                if role in given or f"{role}_file" in given:
                    template.pop(role, None)
                    template.pop(f"{role}_file", None)
            member["template"] = template | given
        if s is not None:
            member["params"] = dict(base.get("params") or {}) | s.params
        members.append(Member(variant, m.name, p.name if p else None, s.name if s else None, build_spec(member, f"{where} ({said})", lines)))
    ev = EvalSpec(name, data, parts, tuple(members), where)
    _check_scoring(ev)
    return ev


def _check_scoring(ev: EvalSpec) -> None:
    s, spec = ev.scoring, ev.base
    if s is None:
        return
    if s.method == "choice" and not spec.effective_choices:
        raise SpecError(f"{ev.where}: scoring.method choice needs `choices:` (or a response_schema with an enum); add them, or score with exact")
    if s.method == "json_fields":
        props = (spec.response_schema or {}).get("properties")
        if not props:
            raise SpecError(f"{ev.where}: scoring.method json_fields needs a response_schema with properties; add one, or score with exact")
        unknown = [f for f in s.fields if f not in props]
        if unknown:
            raise SpecError(f"{ev.where}: scoring.fields.{unknown[0]} is not a property of response_schema ({', '.join(props)}); fix the name")


def judge_spec(ev: EvalSpec, source_path: Path, source_columns: list[str]) -> JobSpec:
    """The judge stage as a job over the first stage's answers (written at `source_path`).
    A template variable the first stage does not produce is refused, naming it."""
    j = ev.parts.judge
    assert j is not None
    check_judge_columns(ev, source_columns)
    data = {
        "name": ev.judge_name,
        "source": {"path": str(source_path), "id_column": "row_id", "optional_columns": ["expected", "answer"]},
        "template": {"user": j.user, **({"system": j.system} if j.system else {})},
        "model": j.model, "route": j.route, "route_options": j.route_options,
        "response_schema": j.verdict_schema, "params": j.params,
        "retry": ev.data.get("retry") or {}, "base_dir": ev.data.get("base_dir", "."),
    }  # fmt: skip
    return build_spec(data, f"{ev.where} judge")


def judge_variables(ev: EvalSpec) -> dict[str, str]:
    """The variables of the judge's templates, with where each is used."""
    from jinja2 import Environment, meta

    j = ev.parts.judge
    found: dict[str, str] = {}
    if j is None:
        return found
    for role, text in (("system", j.system), ("user", j.user)):
        if text:
            for var in sorted(meta.find_undeclared_variables(Environment().parse(text))):
                found.setdefault(var, f"judge.{role}")
    return found


def check_judge_columns(ev: EvalSpec, source_columns: list[str]) -> None:
    produced = list(dict.fromkeys([*STAGE_COLUMNS, *source_columns]))
    problems = [
        f'{ev.where}: {where} uses "{var}", which the first stage does not produce; '
        f"it produces: {', '.join(produced)}. Use one of those, or add the column to the source"
        for var, where in judge_variables(ev).items()
        if var not in produced
    ]
    if problems:
        raise SpecError.from_problems(f"{ev.where}: judge template", problems)
