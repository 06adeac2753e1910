"""The dashboard's eval view: `lowtide compare`'s report as a page, with an accuracy-versus-
cost chart (one point per variant). The same access rule as the rest of the dashboard.

    GET /dashboard/evals                 every eval of the store, linked
    GET /dashboard/evals/{name}          one eval: variants, chart, pairs, confusion, disagreements
    GET /dashboard/api/evals/{name}      its report as JSON (`lowtide compare --json`)
"""

from __future__ import annotations

from typing import Any

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy import select

from lowtide.core.errors import LowtideError
from lowtide.engine.compare import EvalReport, compare
from lowtide.engine.evals import stored_eval
from lowtide.server.dashboard import ASSETS, refused, viewer_allowed
from lowtide.store.schema import evals

router = APIRouter(include_in_schema=False)
_templates = jinja2.Environment(loader=jinja2.FileSystemLoader(ASSETS), autoescape=True)
W, H, PAD = 560, 300, 48  # the chart's size and margin, in SVG units


@router.get("/dashboard/evals")
def eval_list(request: Request) -> Response:
    if not viewer_allowed(request):
        return refused(request)
    with request.app.state.server.store.begin() as conn:
        names = list(conn.scalars(select(evals.c.name).order_by(evals.c.name)))
    return HTMLResponse(_templates.get_template("evals.html").render(names=names, report=None), headers={"cache-control": "no-store"})


@router.get("/dashboard/evals/{name}")
def eval_page(request: Request, name: str) -> Response:
    if not viewer_allowed(request):
        return refused(request)
    try:
        report = _report(request, name)
    except LowtideError as err:
        return HTMLResponse(_templates.get_template("evals.html").render(names=[], report=None, error=str(err)), status_code=404)
    html = _templates.get_template("evals.html").render(report=report, points=chart_points(report), W=W, H=H, PAD=PAD)
    return HTMLResponse(html, headers={"cache-control": "no-store"})


@router.get("/dashboard/api/evals/{name}")
def eval_json(request: Request, name: str) -> Response:
    if not viewer_allowed(request):
        return refused(request)
    try:
        return JSONResponse(_report(request, name).to_dict(), headers={"cache-control": "no-store"})
    except LowtideError as err:
        return JSONResponse({"error": str(err)}, status_code=404)


def _report(request: Request, name: str) -> EvalReport:
    store = request.app.state.server.store
    return compare(store, stored_eval(store, name))


def chart_points(report: EvalReport) -> list[dict[str, Any]]:
    """Each variant with an accuracy, placed on the chart: cost across, accuracy up."""
    shown = [v for v in report.variants if v.accuracy is not None]
    top = max([v.cost_usd or 0.0 for v in shown] + [1e-9])
    return [
        {
            "variant": v.variant, "accuracy": v.accuracy, "cost": v.cost_usd or 0.0,
            "x": PAD + (W - 2 * PAD) * ((v.cost_usd or 0.0) / top),
            "y": H - PAD - (H - 2 * PAD) * v.accuracy,
            "y_lo": H - PAD - (H - 2 * PAD) * (v.ci_low or v.accuracy),
            "y_hi": H - PAD - (H - 2 * PAD) * (v.ci_high or v.accuracy),
        }
        for v in shown
    ]  # fmt: skip
