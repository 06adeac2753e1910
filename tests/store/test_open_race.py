"""Two processes opening one new PostgreSQL store at once (two workers started together on
a fresh database): the second waits for the first's migrations instead of failing."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from lowtide.store.db import Store
from lowtide.store.migrations import MIGRATIONS, apply_migrations
from lowtide.store.schema import migrations
from tests.conftest import fresh_pg_schema
from tests.engine.concurrency import Background, ran_or_waits

pytestmark = pytest.mark.postgres


def test_a_store_opened_while_another_process_creates_it_waits_and_opens(pg_schema_url):
    with fresh_pg_schema("lowtide_open") as url:
        first = sa.create_engine(url)
        name = f"lt_{uuid.uuid4().hex[:12]}"
        try:
            with first.connect() as conn:
                tx = conn.begin()
                apply_migrations(conn)  # the first process, its migrations not committed yet
                opener = Background(lambda: Store(f"{url}&application_name={name}"))
                opener.start()
                ran_or_waits(SimpleNamespace(engine=first), name, opener)  # a Store here would wait too
                tx.commit()
            store = opener.result()
            with store.begin() as conn:
                assert conn.execute(sa.select(sa.func.count()).select_from(migrations)).scalar_one() == len(MIGRATIONS)
            store.close()
        finally:
            first.dispose()
