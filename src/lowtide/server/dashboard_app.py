"""The dashboard alone (`lowtide dashboard`): serve's dashboard routers (dashboard.py,
dashboard_evals.py) over any store, read-only, with no batch API mounted and nothing run.

Its store is opened as read-only commands open it (`Store(create=False)`: a missing SQLite
file is an error, never a new store) and the dashboard only reads it. It keeps serve's
protections: the same guard against other sites (guard.py: Host and Origin) and, with keys,
the dashboard's key check (dashboard.py `viewer_allowed`). Serve's own API jobs are left out
unless `api_jobs` (or a request's `?api_jobs=true`) asks for them (dashboard.py).

    app = create_dashboard_app(ServeConfig(db="lowtide.db"))
    uvicorn.run(app, port=8700)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.responses import RedirectResponse

from lowtide.server import dashboard, dashboard_evals, errors, guard
from lowtide.server.context import ServeConfig
from lowtide.store.db import Store


@dataclass(frozen=True, slots=True)
class Viewer:
    """What the dashboard's handlers reach as `request.app.state.server`: the access
    options (`config.api_keys`, `allow_hosts`, `allow_origins`) and the store."""

    config: ServeConfig
    store: Store


def create_dashboard_app(config: ServeConfig, *, api_jobs: bool = False) -> FastAPI:
    """The dashboard over `config.db` (opened now; closed with the app's lifespan)."""
    store = Store(config.db, create=False)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            store.close()

    app = FastAPI(title="lowtide dashboard", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = Viewer(config, store)
    app.state.api_jobs = api_jobs  # the default of `?api_jobs=` (dashboard.py)
    errors.install(app)
    guard.protect(app, config)  # outermost: other sites are refused before anything else

    @app.get("/", include_in_schema=False)
    def _home() -> RedirectResponse:
        return RedirectResponse("/dashboard", status_code=307)

    for module in (dashboard, dashboard_evals):
        app.include_router(module.router)
    return app
