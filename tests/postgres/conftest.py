"""Real PostgreSQL for the shared-store tests: a fresh database per test module on
127.0.0.1:5432 (trust auth), a fresh ledger schema per test, both dropped afterwards.

Tests skip, saying why, only when no server answers (`scripts/test-services.sh` starts one).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import GUARD

PG_HOST = os.environ.get("LEDGER_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("LEDGER_TEST_PG_PORT", "5432"))


def _admin_url() -> str | None:
    import psycopg

    errors = []
    for user in ("postgres", "root"):
        for db in ("postgres", "test"):
            url = f"postgresql://{user}@{PG_HOST}:{PG_PORT}/{db}"
            try:
                with psycopg.connect(url, connect_timeout=5) as conn:
                    conn.execute("SELECT 1")
                return url
            except psycopg.Error as exc:
                errors.append(f"{user}@{db}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}")
    pytest.skip(f"no PostgreSQL server answers on {PG_HOST}:{PG_PORT} ({'; '.join(errors)[:300]}); run scripts/test-services.sh")
    return None


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    return _admin_url()


@pytest.fixture(scope="module")
def pg_database(pg_admin_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of a database of its own for this test module."""
    import psycopg

    name = f"ledger_test_{secrets.token_hex(5)}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = pg_admin_url.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with request.config.stash[GUARD].shared_teardown("postgres"), \
                psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """A fresh, empty ledger (its own schema) in the module's database."""
    return f"{pg_database}?schema=t_{secrets.token_hex(6)}"


@pytest.fixture(params=["sqlite", "postgres"])
def new_ledger_url(request: pytest.FixtureRequest, tmp_path) -> Callable[[], str]:
    """The same tests on both backends: each call gives a fresh, empty ledger's URL."""
    counter = iter(range(1_000_000))
    if request.param == "sqlite":
        return lambda: f"sqlite:///{tmp_path / f'ledger{next(counter)}.db'}"
    database = request.getfixturevalue("pg_database")
    return lambda: f"{database}?schema=t_{secrets.token_hex(6)}"


@pytest.fixture
def ledger_url(new_ledger_url) -> str:
    return new_ledger_url()


@pytest.fixture
def store_factory(ledger_url: str) -> Iterator[Callable]:
    """Opens handles on the test's ledger (several handles = several writers); all closed after."""
    from ledger.store import open_store

    opened = []

    def factory(create: bool = True):
        store = open_store(ledger_url, create=create)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def store(store_factory):
    return store_factory()


@pytest.fixture
def new_pg_url(pg_database: str) -> Callable[[], str]:
    return lambda: f"{pg_database}?schema=t_{secrets.token_hex(6)}"
