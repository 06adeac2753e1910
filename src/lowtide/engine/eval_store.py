"""Evals kept in the store: saved when one is run, read back by name.

Apart from the run path (engine/evals.py) so that reading an eval back, as `lowtide compare`
and the dashboard do, imports no engine tick, loader or route. A spec read back passed its
checks when it was stored: its params are not checked against the SDK's types again
(core/spec.py `rebuilt_from_store`), which would import the openai package for nothing.
"""

from __future__ import annotations

import orjson
from sqlalchemy import select

from lowtide.core.errors import JobNotFoundError
from lowtide.core.evals import EvalSpec, build_eval
from lowtide.core.spec import rebuilt_from_store
from lowtide.store.db import Store
from lowtide.store.schema import evals


def save_eval(store: Store, ev: EvalSpec, now: float) -> None:
    data = orjson.dumps(ev.data, default=str).decode()
    with store.begin() as conn:
        found = conn.execute(select(evals.c.id).where(evals.c.name == ev.name)).scalar()
        if found is None:
            conn.execute(evals.insert().values(name=ev.name, spec=data, created_at=now, updated_at=now))
        else:
            conn.execute(evals.update().where(evals.c.id == found).values(spec=data, updated_at=now))


def eval_named(store: Store, name: str) -> EvalSpec | None:
    """The stored eval of that name, or None where there is none."""
    try:
        return stored_eval(store, name)
    except JobNotFoundError:
        return None


def stored_eval(store: Store, name: str) -> EvalSpec:
    with store.read() as conn:  # reading only: never waits for a worker writing the store
        data = conn.execute(select(evals.c.spec).where(evals.c.name == name)).scalar()
        if data is None:
            known = list(conn.scalars(select(evals.c.name).order_by(evals.c.name).limit(20)))
            hint = f"; evals in this store: {', '.join(known)}" if known else "; this store has no evals yet (`lowtide run` an eval spec)"
            raise JobNotFoundError(f'no eval named "{name}"{hint}')
    with rebuilt_from_store():
        return build_eval(orjson.loads(data), where=f"eval {name!r} (stored)")
