"""The PostgreSQL connection under every part of the shared store: URL, schema, statements.

Everything lives in one PostgreSQL schema (default `ledger`; `?schema=name` in the URL or
`schema=` picks another), so several ledgers, or tests, can share one database. One
connection in autocommit mode, shared by the store's parts (and its leases) under a lock.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from ledger.errors import StoreError, safe_url
from ledger.store import sqlfiles
from ledger.store.base import FORMAT_VERSION, check_format, check_no_holders

PACKAGE = __package__
# The role that may append but never rewrite, and the one that may only read (roles.sql).
WRITER_ROLE = "ledger_writer"
READER_ROLE = "ledger_reader"


def split_url(url: str, schema: str | None) -> tuple[str, str]:
    """(libpq URL, schema): `?schema=` is ours, libpq would refuse it."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    from_url = [v for k, v in query if k == "schema"]
    rest = [(k, v) for k, v in query if k != "schema"]
    name = schema or (from_url[-1] if from_url else "ledger")
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", name):
        raise StoreError(f"invalid ledger schema name {name!r}", hint="use lower-case letters, digits and _")
    scheme = "postgresql" if parts.scheme == "postgres" else parts.scheme
    return urlunsplit((scheme, parts.netloc, parts.path, urlencode(rest, quote_via=quote), parts.fragment)), name


class PgDatabase:
    """One connection to one ledger schema; created (or upgraded) on open when allowed."""

    def __init__(self, url: str, *, create: bool = True, schema: str | None = None, upgrade: bool = False) -> None:
        """`upgrade`: open an older format too, for `upgrade_format` alone (`ledger upgrade`);
        otherwise a ledger in any format but this code's is refused (base.check_format)."""
        self.url = url
        self.dsn, self.schema = split_url(url, schema)
        # The NOTIFY channel of appends (schema.sql's append functions and move_head notify it).
        self.channel = f"{self.schema}_appended"
        self.lock = threading.RLock()
        self.conn = self.connect()
        # One cursor kept for the hot call, a single append: `conn.execute` makes a cursor at
        # each call (~20 us of CPU and ~50 us of wall time an append, measured at stop 48).
        self.cursor = self.conn.cursor()
        # {s}: the schema; {channel}: the NOTIFY channel as a literal (the append functions
        # and move_head notify it).
        self._names = {"s": sql.Identifier(self.schema).as_string(self.conn),
                       "channel": sql.Literal(self.channel).as_string(self.conn)}
        self.q = self.statements("queries.sql")
        try:
            self._init_schema(create, upgrade)
        except BaseException:
            self.conn.close()
            raise

    def connect(self) -> psycopg.Connection:
        try:
            return psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(
                f"cannot connect to PostgreSQL ledger {self.safe_url}: {first}",
                hint="is the server running and the URL right (postgresql://user@host:port/db)?",
            ) from exc

    @property
    def safe_url(self) -> str:
        return safe_url(self.url)

    def render(self, text: str, **names: str) -> str:
        """An SQL file's text with its {s} (schema) and other {name}s filled in."""
        for key, value in {**self._names, **names}.items():
            text = text.replace("{" + key + "}", value)
        return text

    def statements(self, filename: str) -> dict[str, str]:
        return {name: self.render(text) for name, text in sqlfiles.queries(PACKAGE, filename).items()}

    def execute(self, query: str, params: Sequence | Mapping | None = None) -> list[tuple]:
        """Run one statement (autocommit: its own transaction) under the lock."""
        with self.lock:
            cur = self.conn.execute(query, params)  # type: ignore[arg-type]  # rendered SQL files
            return cur.fetchall() if cur.description else []

    # -- set-up ---------------------------------------------------------------------------
    def _format(self) -> str | None:
        conn = self.conn
        if not conn.execute(self.q["exists"], (f'"{self.schema}".meta',)).fetchone()[0]:
            return None
        row = conn.execute(self.q["format"]).fetchone()
        return row[0] if row else None

    def _init_schema(self, create: bool, upgrade: bool) -> None:
        found = self._format()
        if found is not None:
            check_format(found, self.safe_url, upgrade=upgrade)
            return
        if not create:
            raise StoreError(
                f"no ledger in schema {self.schema!r} at {self.safe_url}",
                hint="check --store / LEDGER_STORE, or create it with a writing command",
            )
        self._install(upgrading=False, dry_run=False)

    def upgrade_format(self, *, dry_run: bool = False, force: bool = False) -> tuple[int, int]:
        """Bring an older format to this code's, in place, in one transaction (a failure
        leaves the old format whole); events are never touched. (from, to); from == to when
        nothing was to do. `dry_run` runs the same transaction and rolls it back. Refused
        while a lease is held (a running reconciler), unless `force`."""
        return self._install(upgrading=True, dry_run=dry_run, force=force), FORMAT_VERSION

    def _install(self, *, upgrading: bool, dry_run: bool, force: bool = False) -> int:
        """Create the schema (none yet) or upgrade it (an older format), under the schema
        lock; then (re)grant the roles. The format found, FORMAT_VERSION for a new one."""
        role_names = {
            "role": sql.Literal(WRITER_ROLE).as_string(self.conn),
            "role_id": sql.Identifier(WRITER_ROLE).as_string(self.conn),
            "reader": sql.Literal(READER_ROLE).as_string(self.conn),
            "reader_id": sql.Identifier(READER_ROLE).as_string(self.conn),
        }
        conn = self.conn
        found: str | None = None
        try:
            with conn.transaction():
                conn.execute(self.q["schema_lock"], (f"tpu-ledger schema {self.schema}",))
                found = self._format()  # again, under the lock: another process may be done
                if found is None and upgrading:
                    raise StoreError(f"no ledger in schema {self.schema!r} at {self.safe_url}",
                                     hint="check --store / LEDGER_STORE")
                if found is None or check_format(found, self.safe_url, upgrade=upgrading):
                    if found is not None and not force:
                        check_no_holders([r[0] for r in conn.execute(self.q["live_holders"])], self.safe_url)
                    # Every step from the format found (upgrade-N.sql: N -> N + 1), then schema.sql.
                    steps = range(int(found), FORMAT_VERSION) if found is not None else range(0)
                    scripts = [f"upgrade-{n}.sql" for n in steps] + ["schema.sql"]
                    for filename in scripts:
                        conn.execute(self.render(sqlfiles.script(PACKAGE, filename)))  # type: ignore[arg-type]
                    conn.execute(self.q["set_format"], (str(FORMAT_VERSION),))
                if dry_run:
                    raise psycopg.Rollback()
            if not dry_run:
                with conn.transaction():
                    conn.execute(self.render(sqlfiles.script(PACKAGE, "roles.sql"), **role_names))  # type: ignore[arg-type]
        except psycopg.Error as exc:
            what = "create" if found is None else f"upgrade (format {found} to {FORMAT_VERSION})"
            raise StoreError(
                f"cannot {what} the ledger schema {self.schema!r} at {self.safe_url}: {exc}",
                hint="the user needs CREATE on the database (or create the schema once as its owner)",
            ) from exc
        return FORMAT_VERSION if found is None else int(found)

    def close(self) -> None:
        with self.lock:
            self.conn.close()


class SideTable:
    """A small table beside the ledger's events (leases, heartbeats) on a PgDatabase, with its
    queries (`queries_file`), judged by the server's clock; it closes the database only when it
    owns it (`owns_db`: opened for it alone)."""

    queries_file: str

    def __init__(self, db: PgDatabase, *, owns_db: bool = False) -> None:
        self._db = db
        self._q = db.statements(self.queries_file)
        self._owns = owns_db

    def close(self) -> None:
        if self._owns:
            self._db.close()
