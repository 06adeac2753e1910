"""What can be checked before the first request leaves, so a paid job never runs only to
fail at the end: the results can be written where the spec (or --out) says, in a known
format (a local folder, an object store's bucket and credentials, a SQL table's columns),
the response schema has Arrow types, a budgeted job's model has a price and what its
template adds has a bound, and a provider's model name and output limit can be right."""

from __future__ import annotations

import difflib
import os
import uuid
from pathlib import Path

from lowtide.core import genai_source
from lowtide.core.endpoints import EMBEDDINGS
from lowtide.core.errors import InputError, LowtideError, SpecError
from lowtide.core.input_bounds import image_bound
from lowtide.core.locations import Location, location, scheme_of, store_problem
from lowtide.core.output_target import OutputTarget
from lowtide.core.pricing import Catalog, Tier, attempt_cost, billing_of, load_catalog
from lowtide.core.spec import JobSpec, format_of
from lowtide.core.types import Usage


def check_target(spec: JobSpec, target: OutputTarget) -> None:
    """Refuse, before anything is sent, results that could not be written where `target`
    says: a file (check_output), a partitioned folder (writable, its partition columns among
    the results'), a SQL table (the database answers; an existing table has every column);
    and a response schema the typed results cannot hold."""
    embedding = spec.request_endpoint == EMBEDDINGS
    if embedding and (target.table is not None or target.partition_by):
        raise SpecError(f"{target.where}: an embedding job's vectors go to one .parquet, .jsonl or .npy file "
                        "(or a PostgreSQL table: `lowtide results --pg-url`); give output.path a file")  # fmt: skip
    if target.table is None and not target.partition_by:
        check_output(target.path, target.where, embedding=embedding, fmt=target.fmt)
    elif target.partition_by:
        _check_folder(target)
    if embedding:
        return
    check_schema_types(spec)
    if target.table is None and not target.partition_by:
        return
    rows = _result_columns(spec)
    if rows is None:  # the source itself is at fault: loading it says how
        return
    if target.table is not None:
        from lowtide.engine.sql_sink import check_table

        check_table(rows, target.url, target.table)
    elif target.partition_by:
        from lowtide.engine.partitions import check_partition_columns

        try:
            check_partition_columns(target.partition_by, rows.columns(), "the results")
        except LowtideError as err:
            raise SpecError(str(err)) from None


def _result_columns(spec: JobSpec):
    from lowtide.engine.export import ResultColumns

    try:
        rows = ResultColumns(spec)
        rows.columns()
    except LowtideError:
        return None
    return rows


def check_schema_types(spec: JobSpec) -> None:
    """The Arrow types the typed results (Parquet, a SQL table) give the response schema's
    fields: a schema with no one type for a field falls back to JSON text; one that cannot
    be typed at all is refused now, not after the run."""
    if spec.response_schema is None:
        return
    import pyarrow as pa

    from lowtide.engine.answer_columns import schema_type

    props = spec.response_schema.get("properties")
    fields = props if isinstance(props, dict) and props else {"parsed": spec.response_schema}
    try:
        pa.schema([(name, schema_type(sub, spec.response_schema) or pa.string()) for name, sub in fields.items()])
    except Exception as err:
        raise SpecError(f"response_schema: the results cannot hold its fields as typed columns ({err}); simplify the schema") from None


def check_output(path: str | Path, where: str = "output.path", embedding: bool = False, fmt: str | None = None) -> Path | str:
    """Refuse a results path whose format is unknown or that cannot be written, by name.
    `embedding`: an embedding job's vectors (.parquet, .jsonl or .npy, docs/embeddings.md);
    `fmt`: the spec's `output.format`, which names the format instead of the extension.
    An object-store URL: its bucket must exist and the credentials write there (a small
    object is written and removed)."""
    if embedding and fmt is not None:
        raise SpecError(f"output.format {fmt!r}: an embedding job's vectors take their format from the file's extension "
                        "(.parquet, .jsonl or .npy); remove output.format")  # fmt: skip
    url = scheme_of(str(path)) is not None
    name = Path(str(path).rstrip("/").rsplit("/", 1)[-1])
    if not url:
        path = Path(str(path).removeprefix("file://")).expanduser()
        if path.is_dir():
            raise SpecError(f"{where} {path}: is a folder; name a file in it, e.g. {path / 'results.csv'}")
    if embedding and name.suffix.lower() not in (".parquet", ".jsonl", ".npy"):
        raise SpecError(f'{where} {path}: an embedding job\'s vectors are written as .parquet, .jsonl or .npy, not "{name.suffix}"')
    try:
        if not embedding:
            format_of(name, fmt)
    except SpecError:
        hint = ", or set output.format" if where == "output.path" else ""
        raise SpecError(f'{where} {path}: unknown file extension "{name.suffix}"; use .csv, .jsonl or .parquet{hint}') from None
    if url:
        loc = _store_location(str(path), where)
        if _isdir(loc, where):
            raise SpecError(f"{where} {path}: is a folder; name a file in it, e.g. {str(path).rstrip('/')}/results.csv")
        _probe(loc, loc.path.rpartition("/")[0], where)
        return str(path)
    _check_local_folder(path, _existing_parent(path), where)
    return path


def _check_folder(target: OutputTarget) -> None:
    """A partitioned dataset's folder: writable, and not a file."""
    where, path = target.where, target.path
    if scheme_of(path) is not None:
        loc = _store_location(path, where)
        if _isfile(loc, where):
            raise SpecError(f"{where} {path}: is a file; with partition_by, output.path names a folder")
        _probe(loc, loc.path.rstrip("/"), where)
        return
    folder = Path(path)
    if folder.is_file():
        raise SpecError(f"{where} {path}: is a file; with partition_by, output.path names a folder")
    _check_local_folder(folder, folder if folder.is_dir() else _existing_parent(folder), where)


def _check_local_folder(path: Path, folder: Path, where: str) -> None:
    if not folder.is_dir():
        raise SpecError(f"{where} {path}: {folder} is a file, not a folder; choose another path")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.is_file() and not os.access(path, os.W_OK)):
        raise SpecError(f"{where} {path}: cannot write there (permission denied); choose a path you can write")
    probe = folder / f".lowtide-probe-{os.getpid()}"
    try:  # os.access says yes for read-only file systems and /proc: try it
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise SpecError(f"{where} {path}: cannot write in {folder} ({err.strerror}); choose a path you can write") from None


def _store_location(url: str, where: str) -> Location:
    try:
        return location(url)
    except LowtideError as err:
        raise SpecError(f"{where} {err}") from None


def _isdir(loc: Location, where: str) -> bool:
    try:
        return loc.fs.isdir(loc.path)
    except Exception as err:
        raise SpecError(f"{where} {store_problem(loc.text, err, 'write')}") from None


def _isfile(loc: Location, where: str) -> bool:
    try:
        return loc.fs.isfile(loc.path)
    except Exception as err:
        raise SpecError(f"{where} {store_problem(loc.text, err, 'write')}") from None


def _probe(loc: Location, folder: str, where: str) -> None:
    """Write and remove a small object in `folder`: the bucket exists, and the credentials
    in use may write (and remove) there."""
    probe = f"{folder}/.lowtide-probe-{uuid.uuid4().hex[:12]}"
    try:
        loc.fs.pipe_file(probe, b"")
        loc.fs.rm_file(probe)
    except Exception as err:
        raise SpecError(f"{where} {store_problem(loc.text, err, 'write')}") from None


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
            billing = billing_of(route, options)
            unpriceable = billing is not None and billing.provider is None and billing.tier is not Tier.SELF_HOSTED
            fix = "Remove budget_usd, or send through a priced route" if unpriceable else "Add the price, or remove budget_usd"
            raise SpecError(
                f'{where}: budget_usd is set, but model "{model}" on route'
                f" {route} has no price ({cost.note}); "
                f"no request could be checked against the budget. {fix}"
            )
        if cost.usd:  # a route that bills tokens: what the template adds must have a bound
            _check_parts_bounded(spec, where, route, options, model)


def _check_parts_bounded(spec: JobSpec, where: str, route: str, options: dict, model: str) -> None:
    """What the template adds to every request must have a most it is billed, or no dispatch
    of the job could be sent (engine/budget.py refuses it; core/input_bounds.py)."""
    if spec.template.files:
        raise SpecError(f"{where}: budget_usd is set, but template.files adds a PDF to every request, billed by its pages, "
                        "which lowtide cannot count before sending, so no request could be checked against the budget. "
                        "Remove budget_usd, or template.files")  # fmt: skip
    billing = billing_of(route, options)
    if spec.template.images and image_bound(model, billing.provider if billing else None) is None:
        raise SpecError(f'{where}: budget_usd is set, but template.images adds an image to every request and "{model}" on '
                        f"{route} has no documented most an image is billed (lowtide knows Claude's, Gemini's and OpenAI's), "
                        "so no request could be checked against the budget. Remove budget_usd, or template.images")  # fmt: skip


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
