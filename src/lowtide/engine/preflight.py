"""What can be checked before the first request leaves, so a paid job never runs only to
fail at the end: the results file can be written in a known format, a budgeted job's
model has a price, and a provider's model name and output limit can be right."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from lowtide.core import genai_source
from lowtide.core.errors import InputError, SpecError
from lowtide.core.pricing import Catalog, attempt_cost, billing_of, load_catalog
from lowtide.core.spec import JobSpec, format_of
from lowtide.core.types import Usage


def check_output(path: str | Path, where: str = "output.path", embedding: bool = False, fmt: str | None = None) -> Path:
    """Refuse a results path whose format is unknown or that cannot be written, by name.
    `embedding`: an embedding job's vectors (.parquet, .jsonl or .npy, docs/embeddings.md);
    `fmt`: the spec's `output.format`, which names the format instead of the extension."""
    path = Path(path)
    if embedding and fmt is not None:
        raise SpecError(f"output.format {fmt!r}: an embedding job's vectors take their format from the file's extension "
                        "(.parquet, .jsonl or .npy); remove output.format")  # fmt: skip
    if path.is_dir():
        raise SpecError(f"{where} {path}: is a folder; name a file in it, e.g. {path / 'results.csv'}")
    if embedding and path.suffix.lower() not in (".parquet", ".jsonl", ".npy"):
        raise SpecError(f'{where} {path}: an embedding job\'s vectors are written as .parquet, .jsonl or .npy, not "{path.suffix}"')
    try:
        if not embedding:
            format_of(path, fmt)
    except SpecError:
        hint = ", or set output.format" if where == "output.path" else ""
        raise SpecError(f'{where} {path}: unknown file extension "{path.suffix}"; use .csv, .jsonl or .parquet{hint}') from None
    folder = _existing_parent(path)
    if not folder.is_dir():
        raise SpecError(f"{where} {path}: {folder} is a file, not a folder; choose another path")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SpecError(f"{where} {path}: cannot write there (permission denied); choose a path you can write")
    probe = folder / f".lowtide-probe-{os.getpid()}"
    try:  # os.access says yes for read-only file systems and /proc: try it
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise SpecError(f"{where} {path}: cannot write in {folder} ({err.strerror}); choose a path you can write") from None
    return path


def _existing_parent(path: Path) -> Path:
    """The nearest folder of `path` that exists (the export creates the rest)."""
    folder = path.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_prices(spec: JobSpec, where: str) -> None:
    """A job with `budget_usd` must be priceable on each route it may run on: else it would
    stop before its first request with "budget exhausted" though nothing was spent."""
    if spec.budget_usd is None:
        return
    try:
        catalog = load_catalog()
    except InputError as err:
        raise SpecError(f"{where}: budget_usd is set but the price file did not load: {err}") from None
    for route, options, lane_model in spec.sending_routes:
        model = lane_model or spec.model
        cost = attempt_cost(Usage(input_tokens=1, output_tokens=1), model, route, options, catalog=catalog)
        if cost.usd is None:
            raise SpecError(
                f'{where}: budget_usd is set, but model "{model}" on route'
                f" {route} has no price ({cost.note}); "
                "no request could be checked against the budget. Add the price, or remove budget_usd"
            )


def check_model(spec: JobSpec, where: str) -> None:
    """On a provider's route, a model name one or two letters off a model the price catalog
    knows is a typo (every request would fail at the provider, a day later on a batch), and
    an output limit past the model's whole context window can never be met (it fails every
    request, and the estimate and budget price each request at it). A name with no close
    match may be newer than the catalog: it passes."""
    try:
        catalog = load_catalog()
    except InputError:  # check_prices names a broken price file where it matters
        return
    for route, options, lane_model in spec.sending_routes:
        billing = billing_of(route, options)
        provider = billing.provider if billing is not None else None
        if provider is None:
            continue
        model = lane_model or spec.model
        if catalog.explain(provider, model) is None:
            meant = _letters_off(model, catalog, provider)
            if meant is not None:
                raise SpecError(
                    f'{where}: model "{model}" is not among the price catalog\'s {provider} models; did you mean "{meant}"? '
                    "Fix the name, or, if it is a model newer than the catalog, give it a price (docs/costs.md)"
                )
            continue
        window = genai_source.context_window(provider, model)
        limit = spec.output_limit
        if window is not None and limit is not None and limit > window:
            key = next(k for k in ("max_completion_tokens", "max_tokens", "max_output_tokens") if spec.params.get(k) == limit)
            raise SpecError(
                f"{where}: params.{key} {limit:,} is more than {model}'s whole context window ({window:,} tokens, "
                "as genai-prices gives it); no answer can be that long: lower it"
            )


def _letters_off(model: str, catalog: Catalog, provider: str) -> str | None:
    """A known model that `model` misses by at most two letters (never a digit: gpt-5.2 is
    not a typo of gpt-5.1)."""
    wanted = model.strip().lower()
    for known in difflib.get_close_matches(wanted, catalog.known_models(provider), n=3, cutoff=0.85):
        spans = [(wanted[i1:i2], known[j1:j2]) for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, wanted, known).get_opcodes() if op != "equal"]
        changed = "".join(a + b for a, b in spans)
        if 0 < len(changed) <= 2 and changed.isalpha():
            return known
    return None
