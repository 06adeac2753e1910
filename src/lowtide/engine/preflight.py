"""What can be checked before the first request leaves, so a paid job never runs only to
fail at the end: the results file can be written in a known format, and a budgeted job's
model has a price."""

from __future__ import annotations

import os
from pathlib import Path

from lowtide.core.errors import InputError, SpecError
from lowtide.core.pricing import attempt_cost, load_catalog
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
