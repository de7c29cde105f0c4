"""PostgreSQL on 127.0.0.1:5432 (trust auth): one database per test process, created on first
use and dropped at exit, and one ledger schema per URL, dropped at teardown."""

from __future__ import annotations

import atexit
import os
import secrets
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

HOST = os.environ.get("LEDGER_TEST_PG_HOST", "127.0.0.1")
PORT = int(os.environ.get("LEDGER_TEST_PG_PORT", "5432"))


class PostgresBackend:
    name = "postgres"

    def __init__(self) -> None:
        self._admin: str | None = None
        self._database: str | None = None
        self._why_not: str | None = None
        self._probed = False

    def _probe(self) -> None:
        if self._probed:
            return
        self._probed = True
        import psycopg

        errors = []
        for user in ("postgres", "root"):
            for db in ("postgres", "test"):
                url = f"postgresql://{user}@{HOST}:{PORT}/{db}"
                try:
                    with psycopg.connect(url, connect_timeout=5) as conn:
                        conn.execute("SELECT 1")
                    self._admin = url
                    return
                except psycopg.Error as exc:
                    errors.append(f"{user}@{db}: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}")
        self._why_not = f"no PostgreSQL server answers on {HOST}:{PORT} ({'; '.join(errors)[:300]}); run scripts/test-services.sh"

    def skip_reason(self) -> str | None:
        self._probe()
        return self._why_not

    def _db_url(self) -> str:
        import psycopg

        if self._database is None:
            name = f"ledger_test_{secrets.token_hex(5)}"
            with psycopg.connect(self._admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            self._database = f"{self._admin.rsplit('/', 1)[0]}/{name}"
            atexit.register(self._drop_database, name)
        return self._database

    def _drop_database(self, name: str) -> None:
        import psycopg

        try:
            with psycopg.connect(self._admin, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error:
            pass

    def new_url(self, tmp_path: Path) -> str:
        return f"{self._db_url()}?schema=t_{secrets.token_hex(6)}"

    @staticmethod
    def _connect(url: str):
        """A plain connection whose search_path is the ledger's schema, as a person would open."""
        import psycopg

        parts = urlsplit(url)
        schema = parse_qs(parts.query)["schema"][0]
        dsn = parts._replace(query=f"options={quote(f'-c search_path={schema}')}").geturl()
        return psycopg.connect(dsn, autocommit=True), schema

    def tamper(self, url: str, seq: int, data_json: str) -> None:
        conn, _ = self._connect(url)
        with conn, conn.transaction():
            conn.execute("ALTER TABLE events DISABLE TRIGGER events_append_only")
            conn.execute("UPDATE events SET data = %s WHERE seq = %s", (data_json, seq))
            conn.execute("ALTER TABLE events ENABLE TRIGGER events_append_only")

    def raw_execute(self, url: str, sql: str) -> None:
        conn, _ = self._connect(url)
        with conn:
            conn.execute(sql)

    def cleanup(self, urls: list[str]) -> None:
        if not urls or self._database is None:
            return
        import psycopg

        with psycopg.connect(self._database, autocommit=True) as conn:
            for url in urls:
                schema = parse_qs(urlsplit(url).query)["schema"][0]
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


BACKEND = PostgresBackend()
