"""`lowtide render`: the exact request bodies a job would store and send, for a few rows.

Nothing is stored and nothing is sent; the rows go through the loader's own renderer
(engine/render_rows.py), so what is shown is what `lowtide run` stores as each payload's body.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from lowtide.cli.common import EXIT_USAGE, fail, out, say_error
from lowtide.core.errors import LowtideError
from lowtide.core.evals import is_eval_file, load_eval
from lowtide.core.spec import load_spec
from lowtide.engine.render_rows import DEFAULT_ROWS, Rendering, render_rows


def register(app: typer.Typer) -> None:
    app.command("render")(render)


def render(
    spec_path: Annotated[Path, typer.Argument(help="The job spec (YAML), or an eval spec.", show_default=False)],
    rows: Annotated[
        int | None, typer.Option("--rows", min=1, help=f"Render the first N rows of the source (default {DEFAULT_ROWS}).")
    ] = None,
    row: Annotated[
        str | None, typer.Option("--row", help="Render the row with this id (its source.id_column value, or its custom_id).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list of {row, id, custom_id, endpoint, body, problem, routes}.")
    ] = False,
) -> None:
    """Show the request bodies a job would store and send for its first rows, or one row.

    Each body is the one `lowtide run` stores for the row, byte for byte: after the templates,
    images and files, params, param_columns and the endpoint's own structured-output field for
    `choices` or `response_schema`. Each route the requests may run on (the route, and its
    fallback) says whether it takes the body, or is listed as not asked when it cannot be built
    here (no API key set). Nothing is stored and nothing is sent. A row `lowtide run` would
    refuse is shown with its message, and the command exits 2.

    Example: lowtide render examples/classify-tickets.yaml --rows 2

    Example: lowtide render examples/classify-tickets.yaml --row T-1042 --json
    """
    if rows is not None and row is not None:
        say_error("--rows and --row are both given: render the first N rows (--rows N) or one row by its id (--row ID), not both")
        raise typer.Exit(EXIT_USAGE)
    first = rows or DEFAULT_ROWS
    try:
        if is_eval_file(spec_path):
            ev = load_eval(spec_path)
            renderings = [render_rows(m.spec, str(spec_path), first, row) for m in ev.members]
        else:
            renderings = [render_rows(load_spec(spec_path), str(spec_path), first, row)]
    except LowtideError as err:
        raise fail(err) from None
    if as_json:
        print(json.dumps([_row_json(r, rendering) for rendering in renderings for r in rendering.rows], indent=2, ensure_ascii=False))
    else:
        for rendering in renderings:
            _print(rendering)
    refused = sum(r.refused for r in renderings)
    problems = [p for r in renderings for p in r.problems]
    for p in problems:
        say_error(p)
    if refused:
        say_error(f"{refused} of the rows shown would be refused by `lowtide run` (nothing was stored); fix them as each message says")
        raise typer.Exit(EXIT_USAGE)


def _row_json(r, rendering: Rendering) -> dict[str, Any]:
    shape: dict[str, Any] = {"row": r.row, "id": r.id, "custom_id": r.custom_id, "endpoint": r.endpoint, "body": r.body}
    if r.variant is not None:
        shape["variant"] = r.variant
    shape["problem"] = r.problem
    shape["routes"] = [v.as_json() for v in r.routes]
    return shape


def _print(rendering: Rendering) -> None:
    for note in rendering.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
    for r in rendering.rows:
        variant = f"variant {r.variant}, " if r.variant else ""
        named = f"id {r.id}" if r.id is not None else "no id"
        custom = f", custom_id {r.custom_id}" if r.custom_id and r.custom_id != r.id else ""
        out.print(f"── {variant}row {r.row}, {named}{custom}: POST {r.endpoint}", markup=False, soft_wrap=True, style="bold")
        if r.body is not None:
            out.print(json.dumps(r.body, indent=2, ensure_ascii=False), markup=False, soft_wrap=True, highlight=False)
        if r.problem:
            out.print(f"refused: {r.problem}", markup=False, soft_wrap=True)
        for v in r.routes:
            said = f"not asked ({v.not_asked})" if v.not_asked else f"refuses it: {v.refusal}" if v.refusal else "takes it"
            out.print(f"route {v.route}: {said}", markup=False, soft_wrap=True)
