"""The comparison report of an eval (`lowtide compare`, `Eval.compare()`, the dashboard).

Per variant: rows, n scored, accuracy with a 95 % bootstrap interval, rows not scored by
reason (no expected value, not judged, not answered yet: never counted as wrong), failures by
reason (failed requests by their error, cancelled ones as "cancelled"), cost and
its real-time equivalent, cost per correct answer, tokens, median and p95 turnaround. Per
pair of variants: the paired difference over rows both scored, its bootstrap interval and
McNemar's exact p-value. For `choices`: a confusion matrix per variant. And the rows where
the variants' answers differ, for reading.

Everything is read from the store in a few queries per member (no per-row query), and the
expected answers from the source once. Scoring does little per row: each expected value is
normalised once per eval and each distinct answer once per member (a choices eval has a
handful); a variant's verdicts are also two sets of keys (right, wrong), so each pair's counts
are set intersections rather than a loop over the rows; turnarounds are one array per member.

The reads are read-only transactions (`Store.read`): on SQLite a compare never waits for a
worker writing the store (another job's ingest, a worker's tick), nor holds one up. (A judge's
rows are still rendered by engine/stages.py `stage_rows`, in a write transaction.)

An answer counts only for the row it answered (DESIGN invariant 9): a source row whose text
changed since its request was rendered (its fingerprint, engine/loader.py, is not the stored
request's) is not scored against the row's new expected value, but listed under not scored
(CHANGED) until `--requeue-changed` runs it again, as `lowtide results` marks it
`source_changed`. Likewise a judge verdict counts only for the answer it judged: one rendered
from an earlier answer (the member re-ran the row with `--requeue-changed`, the judge has not
yet) leaves the row unscored.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from itertools import combinations
from typing import Any

import numpy as np
from sqlalchemy import func, select

from lowtide.core import fastjson
from lowtide.core.errors import LowtideError, SourceError
from lowtide.core.evals import EvalSpec, Member
from lowtide.core.ids import key_of
from lowtide.core.scoring import check_expected, field_equal, is_missing, normalise, scorer
from lowtide.core.spec import stored_spec
from lowtide.core.states import RequestState
from lowtide.core.stats import accuracy_ci, mcnemar_p, paired_difference_ci, quantiles
from lowtide.engine.stages import source_values, stage_fingerprints
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches, jobs, requests

PICO = 1e12
OTHER = "(other)"  # a choices answer that is none of the choices
NOT_FINISHED = "not answered yet (pending or in flight)"
CHANGED = "source row changed since it was answered; run again with --requeue-changed"
STALE = "judged an earlier answer or row (run again with --requeue-changed)"
NO_STAGE_FILE = "judge's stage file is gone (run the eval again)"


@dataclass(slots=True)
class VariantResult:
    variant: str
    job: str
    model: str
    route: str
    prompt: str | None
    param_set: str | None
    rows: int = 0
    succeeded: int = 0
    scored: int = 0
    correct: int = 0
    accuracy: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    not_scored: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    cost_usd: float | None = None
    realtime_usd: float | None = None
    cost_per_correct: float | None = None
    unpriced_attempts: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    turnaround_p50_s: float | None = None
    turnaround_p95_s: float | None = None
    field_accuracy: dict[str, float] = field(default_factory=dict)  # json_fields


@dataclass(slots=True)
class PairResult:
    a: str
    b: str
    n: int  # rows both scored
    a_only: int  # A right, B wrong
    b_only: int
    difference: float | None  # accuracy(A) - accuracy(B) over those rows
    ci_low: float | None
    ci_high: float | None
    p_value: float | None  # McNemar, exact; None when no row was scored by both


@dataclass(slots=True)
class EvalReport:
    name: str
    method: str | None
    variants: list[VariantResult]
    pairs: list[PairResult]
    confusion: dict[str, dict[str, dict[str, int]]]  # variant -> expected -> answer -> n
    disagreements: list[dict[str, Any]]
    disagreeing_rows: int
    judge: dict[str, Any] | None = None
    # variant -> custom_id -> correct, for every scored row (`lowtide results EVAL`); not in to_dict
    verdicts: dict[str, dict[str, bool]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        whole = asdict(replace(self, verdicts={}))  # not asdict(self): it deep-copies a verdict per row, then dropped
        del whole["verdicts"]
        return whole


def variant_rows(report: EvalReport) -> list[dict]:
    """The per-variant table as flat rows (`compare --out`, `Eval.compare()`)."""
    rows = []
    for v in report.variants:
        d = {k: getattr(v, k) for k in v.__slots__ if k not in ("not_scored", "failures", "field_accuracy")}
        d["not_scored"] = sum(v.not_scored.values())
        d["failed"] = sum(v.failures.values())
        d["failures"] = json.dumps(v.failures, sort_keys=True)
        d |= {f"accuracy_{p}": a for p, a in v.field_accuracy.items()}
        rows.append(d)
    return rows


@dataclass(slots=True)
class _Scored:
    verdicts: dict[str, bool]  # key -> correct, for scored rows
    answers: dict[str, str]  # key -> the answer as compared (normalised), succeeded rows
    by_custom_id: dict[str, bool] = field(default_factory=dict)  # the verdicts again, by custom_id
    right: set[str] = field(default_factory=set)  # the keys of the rows scored correct
    wrong: set[str] = field(default_factory=set)  # ... and wrong


def compare(store: Store, ev: EvalSpec, disagreements: int = 20) -> EvalReport:
    values = source_values(ev.base)
    s = ev.scoring
    method = s.method if s else None
    if s is not None and s.method in ("choice", "regex", "numeric"):
        # The source may have changed since the run checked it: refused again, by row id.
        pairs = ((k, v.get(s.expected)) for k, v in values.items())
        problems = check_expected(s, pairs, ev.base.effective_choices, lambda k: f"{ev.base.source.where} row with id {k}")
        if problems:
            raise SourceError.from_problems(f"{ev.base.source.where}: cannot score", problems)
    judged = _verdicts(store, ev, values) if method == "judge" else None
    expected = _expected(ev, values)
    results: list[VariantResult] = []
    scored: dict[str, _Scored] = {}
    confusion: dict[str, dict[str, dict[str, int]]] = {}
    with store.read() as conn:  # one snapshot, and no wait for a worker writing meanwhile
        stored = {name: (job_id, spec) for name, job_id, spec in conn.execute(
            select(jobs.c.name, jobs.c.id, jobs.c.spec).where(jobs.c.name.in_([m.spec.name for m in ev.members]))
        )}  # fmt: skip
        ids = {name: job_id for name, (job_id, _) in stored.items()}
        costs = _costs(conn, list(ids.values()))
        for m in ev.members:
            r = VariantResult(m.variant, m.spec.name, m.spec.model, m.spec.route, m.prompt, m.param_set)
            results.append(r)
            job_id = ids.get(m.spec.name)
            if job_id is None:  # a variant added to the spec but not run yet
                r.not_scored["not run"] = len(values)
                continue
            rows = conn.execute(
                select(requests.c.custom_id, requests.c.source_key, requests.c.state, requests.c.output, requests.c.parsed, requests.c.error_code,
                       requests.c.fingerprint)
                .where(requests.c.job_id == job_id)
            ).all()  # fmt: skip
            now = _fingerprinter(stored[m.spec.name][1])
            scored[m.variant] = _score(ev, m, r, rows, values, expected, judged, confusion, now)
            c = costs.get(job_id)
            if c is not None:
                cost, realtime, unpriced, tin, tout = c
                r.cost_usd, r.realtime_usd = cost / PICO, realtime / PICO
                r.unpriced_attempts, r.input_tokens, r.output_tokens = unpriced, tin, tout
                r.cost_per_correct = r.cost_usd / r.correct if r.correct else None
            r.turnaround_p50_s, r.turnaround_p95_s = quantiles(_turnarounds(conn, job_id))
        judge = _judge_cost(conn, ev) if ev.parts.judge is not None else None
    pairs = [_paired(a, b, scored[a], scored[b]) for a, b in combinations([r.variant for r in results], 2) if a in scored and b in scored]
    rows, count = _disagreements(ev, scored, values, disagreements)
    verdicts = {variant: s.by_custom_id for variant, s in scored.items()}
    return EvalReport(ev.name, method, results, pairs, confusion, rows, count, judge, verdicts)


def _expected(ev: EvalSpec, values: dict[str, dict]) -> dict[str, tuple[Any, str]]:
    """Each row's expected value of a plain method, with its normalised text, by key; rows
    with none are left out (never scored). Read once for every member."""
    s = ev.scoring
    if s is None or s.method in ("json_fields", "judge"):
        return {}
    out = {}
    for key, row in values.items():
        want = row.get(s.expected)
        if not is_missing(want):
            out[key] = (want, normalise(want))
    return out


def _score(
    ev: EvalSpec, m: Member, r: VariantResult, rows, values: dict[str, dict], expected: dict[str, tuple[Any, str]],
    judged: _Verdicts | None, confusion, now: Callable[[dict], str] | None,
) -> _Scored:  # fmt: skip
    s = ev.scoring
    method = s.method if s is not None else None
    plain = scorer(s) if method in ("regex", "numeric") else None  # exact and choice: normalised texts compared here
    labels = {normalise(c): c for c in ev.base.effective_choices or []}
    matrix: dict[str, dict[str, int]] = {}
    fields_right: Counter[str] = Counter()
    fields_seen: Counter[str] = Counter()
    out = _Scored({}, {})
    right, wrong = out.right, out.wrong
    not_scored: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    said: dict[str, str] = {}  # an answer's text -> normalised: a few distinct answers repeat over the rows
    succeeded = RequestState.SUCCEEDED.value
    failed = RequestState.FAILED.value
    unfinished = (RequestState.PENDING.value, RequestState.DISPATCHED.value)
    r.rows = len(rows)
    for cid, key, state, output, parsed_text, error_code, fingerprint in rows:
        if state != succeeded:
            if state in unfinished:  # its answer may still come: no failure (yet)
                not_scored[NOT_FINISHED] += 1
            else:  # failed by its reason; cancelled, as "cancelled": no answer will come
                failures[error_code or state if state == failed else state] += 1
            continue
        r.succeeded += 1
        row = values.get(k := key_of(key))
        # An answer to the row as it was: neither scored nor shown beside the row as it is.
        # (No stored fingerprint: stored before m008, cannot tell.)
        if now is not None and fingerprint is not None and row is not None and now(row) != fingerprint:
            not_scored[CHANGED] += 1
            continue
        parsed = fastjson.loads(parsed_text) if parsed_text else None
        text = said.get(output)
        if text is None:
            text = said[output] = normalise(output)
        # A JSON answer as its sorted JSON (normalising would strip its braces and quotes:
        # `category": "billing`); a text answer normalised, as exact match compares it.
        is_json = parsed is not None and not isinstance(parsed, str)
        out.answers[key] = json.dumps(parsed, sort_keys=True, ensure_ascii=False) if is_json else text
        if method is None:
            continue
        verdict: bool | None
        if method == "judge":
            verdict = judged.verdicts.get(cid) if judged is not None else None
            if verdict is None:
                not_scored[judged.stale_reason if judged is not None and cid in judged.stale else "not judged"] += 1
                continue
        elif method == "json_fields":
            verdict = None
            row = row or {}
            got = parsed if isinstance(parsed, dict) else {}
            for prop, column in s.fields.items():
                want = row.get(column)
                if is_missing(want):
                    continue
                ok = prop in got and field_equal(got[prop], want)
                fields_seen[prop] += 1
                fields_right[prop] += ok
                verdict = ok if verdict is None else verdict and ok
        else:
            want = expected.get(k)
            if want is None:
                verdict = None
            elif plain is None:  # exact, choice: the answer's text normalised against the expected's
                verdict = text == want[1]
                if method == "choice":
                    got_label = labels.get(text, OTHER)
                    row_of = matrix.setdefault(labels.get(want[1], str(want[0])), {})
                    row_of[got_label] = row_of.get(got_label, 0) + 1
            else:
                verdict = plain(output, parsed, want[0])
        if verdict is None:
            not_scored["no expected value"] += 1
            continue
        out.verdicts[key] = out.by_custom_id[cid] = verdict
        (right if verdict else wrong).add(key)
        (wrong if verdict else right).discard(key)  # a key twice in a job: its last verdict, as in `verdicts`
    r.scored = len(out.verdicts)
    r.correct = len(right)
    r.not_scored, r.failures = dict(not_scored), dict(failures)
    if r.scored:
        r.accuracy = r.correct / r.scored
        r.ci_low, r.ci_high = accuracy_ci(r.correct, r.scored)
    r.field_accuracy = {p: fields_right[p] / n for p, n in fields_seen.items() if n}
    if method == "choice":
        confusion[m.variant] = matrix
    return out


def _fingerprinter(spec_text: str) -> Callable[[dict], str] | None:
    """The fingerprint a source row (its values) renders with now under a member job's stored
    spec, as `lowtide results` tells `source_changed`; None where it cannot be told (a
    template file gone since)."""
    # here: the renderer's imports are paid only by a compare that reads answers
    from lowtide.core.sources import source_of
    from lowtide.core.templates import MessageTemplate
    from lowtide.engine.loader import RowRenderer

    spec = stored_spec(spec_text)
    try:
        render = RowRenderer(spec, MessageTemplate.from_spec(spec), source_of(spec), routes_checked=True)
    except LowtideError:
        return None
    optional = render.optional
    if optional:  # the values as the loader fingerprinted them: optional columns filled in
        return lambda values: render.fingerprint({**optional, **values})
    return render.fingerprint


def _pair(a: str, b: str, va: dict[str, bool], vb: dict[str, bool]) -> PairResult:
    """The pair from two variants' verdicts by key."""
    return _paired(a, b, _sets(va), _sets(vb))


def _sets(verdicts: dict[str, bool]) -> _Scored:
    return _Scored(verdicts, {}, right={k for k, v in verdicts.items() if v}, wrong={k for k, v in verdicts.items() if not v})


def _paired(a: str, b: str, va: _Scored, vb: _Scored) -> PairResult:
    a_only = len(va.right & vb.wrong)  # set intersections: no loop over the rows here
    b_only = len(vb.right & va.wrong)
    n = a_only + b_only + len(va.right & vb.right) + len(va.wrong & vb.wrong)  # rows both scored
    ci = paired_difference_ci(a_only, b_only, n)
    p = mcnemar_p(a_only, b_only) if n else None  # no pair scored by both: nothing was tested
    return PairResult(a, b, n, a_only, b_only, (a_only - b_only) / n if n else None, *(ci or (None, None)), p)


def _costs(conn, job_ids: list[int]) -> dict[int, tuple[int, int, int, int, int]]:
    a = attempts.c
    q = (
        select(
            a.job_id, func.coalesce(func.sum(a.cost_picousd), 0), func.coalesce(func.sum(a.realtime_picousd), 0),
            func.count().filter(a.cost_picousd.is_(None)), func.coalesce(func.sum(a.input_tokens), 0), func.coalesce(func.sum(a.output_tokens), 0),
        )
        .where(a.job_id.in_(job_ids))
        .group_by(a.job_id)
    )  # fmt: skip
    return {row[0]: tuple(int(x) for x in row[1:]) for row in conn.execute(q)}


def _turnarounds(conn, job_id: int) -> list[float]:
    """Seconds from a request's dispatch being sent to its answer being stored."""
    a, d = attempts.c, dispatches.c
    q = (
        select(a.at - func.coalesce(d.submitted_at, d.created_at))
        .select_from(attempts.join(dispatches, a.dispatch_id == d.id))
        .where(a.job_id == job_id, a.applied.is_(True), a.ok.is_(True))
    )
    took = np.array(conn.execute(q).scalars().all(), dtype=float)  # a NULL reads as nan
    return np.maximum(took[~np.isnan(took)], 0.0).tolist()


@dataclass(slots=True)
class _Verdicts:
    verdicts: dict[str, bool]  # first-stage custom_id -> the judge's verdict on its answer now
    stale: set[str]  # custom_ids whose verdict is not on their answer now
    stale_reason: str = STALE


def _verdicts(store: Store, ev: EvalSpec, values: dict[str, dict]) -> _Verdicts:
    """The judge's verdict for each first-stage custom_id it judged, if it judged the answer
    stored now: its request's fingerprint is that of the judge row the answer makes now."""
    # The engine's run path, imported only by an eval with a judge.
    from lowtide.engine.evals import judge_rows

    field_name = ev.parts.judge.verdict_field
    with store.read() as conn:
        job = conn.execute(select(jobs.c.id, jobs.c.spec).where(jobs.c.name == ev.judge_name)).first()
        if job is None:
            return _Verdicts({}, set())
        rows = conn.execute(
            select(requests.c.source_key, requests.c.parsed, requests.c.fingerprint)
            .where(requests.c.job_id == job.id, requests.c.state == RequestState.SUCCEEDED.value)
        ).all()  # fmt: skip
    now = stage_fingerprints(stored_spec(job.spec), judge_rows(store, ev, values)[0])
    out = _Verdicts({}, set(), STALE if now is not None else NO_STAGE_FILE)
    for row_id, parsed, fingerprint in rows:
        if fingerprint is not None and (now is None or now.get(row_id) != fingerprint):  # none: stored before m008
            out.stale.add(row_id)
            continue
        verdict = fastjson.loads(parsed) if parsed else None
        if isinstance(verdict, dict) and isinstance(verdict.get(field_name), bool):
            out.verdicts[row_id] = verdict[field_name]
    return out


def _judge_cost(conn, ev: EvalSpec) -> dict[str, Any] | None:
    job_id = conn.execute(select(jobs.c.id).where(jobs.c.name == ev.judge_name)).scalar()
    if job_id is None:
        return {"job": ev.judge_name, "run": False}
    c = _costs(conn, [job_id]).get(job_id, (0, 0, 0, 0, 0))
    states = dict(conn.execute(select(requests.c.state, func.count()).where(requests.c.job_id == job_id).group_by(requests.c.state)).all())
    return {"job": ev.judge_name, "run": True, "model": ev.parts.judge.model, "route": ev.parts.judge.route,
            "states": states, "cost_usd": c[0] / PICO, "realtime_usd": c[1] / PICO}  # fmt: skip


def _disagreements(ev: EvalSpec, scored: dict[str, _Scored], values: dict[str, dict], limit: int) -> tuple[list[dict], int]:
    """Rows answered by every variant where the answers are not all the same."""
    if len(scored) < 2:
        return [], 0
    names = list(scored)
    common = set.intersection(*(set(scored[n].answers) for n in names))
    differing = sorted(k for k in common if len({scored[n].answers[k] for n in names}) > 1)
    s = ev.scoring
    out = []
    for key in differing[:limit]:
        row = values.get(key_of(key), {})
        item: dict[str, Any] = {"key": key}
        if s is not None and s.expected:
            item["expected"] = row.get(s.expected)
        item["answers"] = {n: scored[n].answers[key] for n in names}
        item["correct"] = {n: scored[n].verdicts.get(key) for n in names}
        out.append(item)
    return out, len(differing)
