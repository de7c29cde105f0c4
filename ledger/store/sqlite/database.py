"""The SQLite file under every part of the embedded store: connection, settings, schema.

Settings and why:
- journal_mode=WAL: readers never block the writer, and a crash leaves no half-written page.
- synchronous=FULL: the WAL is fsynced at every commit, so an append that returned survives
  power loss, not only a killed process (NORMAL would lose the last commits on power loss).
- BEGIN IMMEDIATE: the write lock is taken before reading the head, so several processes
  appending at once serialise and never produce a gap or a duplicate seq/version.
- busy_timeout: a writer waits for another instead of failing at once.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ledger.errors import StoreError, UsageError
from ledger.store import sqlfiles
from ledger.store.base import FORMAT_VERSION, check_format, check_no_holders

PACKAGE = __package__
# The tables a tpu-ledger file may hold; any other table means it is some other database.
TABLES = frozenset({"meta", "events", "snapshots", "cursors", "leases", "heartbeats"})


def connect(path: Path, *, cache_kib: int) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), waiting on locks."""
    db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA busy_timeout = 30000")
    db.execute(f"PRAGMA cache_size = -{int(cache_kib)}")
    return db


def statements(script: str) -> Iterator[str]:
    """The statements of an SQL script, one by one (trigger bodies hold semicolons), so a
    script runs inside a transaction this code controls (executescript would commit first)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            if pending.strip():
                yield pending
            pending = ""
    if any(line.strip() and not line.lstrip().startswith("--") for line in pending.splitlines()):
        raise ValueError(f"incomplete SQL statement at the end of a script: {pending[:80]!r}")


@contextlib.contextmanager
def write_transaction(db: sqlite3.Connection, path: Path) -> Iterator[sqlite3.Connection]:
    """One write transaction: the write lock first (BEGIN IMMEDIATE: what is read inside
    cannot change before the commit), commit at the end, rollback on any error."""
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        raise StoreError(f"ledger {path} is locked: {exc}", hint="another process holds it; retry") from exc
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


class SideTable:
    """A small table beside the events (leases, heartbeats): its own connection to the ledger
    file, its queries (`queries_file`), judged by this host's clock. A subclass creates its
    table in `__init__` (`_q["create"]`) as its readers need."""

    queries_file: str
    cache_kib: int

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.clock = clock
        self._q = sqlfiles.queries(PACKAGE, self.queries_file)
        self._db = connect(self.path, cache_kib=self.cache_kib)

    def _write(self, query: str, params: tuple) -> int:
        """Rows changed by one query in one write transaction (a read of the old row and the
        write are one step for every process)."""
        with write_transaction(self._db, self.path) as db:
            return db.execute(self._q[query], params).rowcount

    def close(self) -> None:
        self._db.close()


class _RollBack(Exception):
    """Ends a dry run's transaction (write_transaction rolls back on any exception)."""


class SQLiteDatabase:
    """Opens (and creates, or upgrades) the ledger file; the base of the store's parts."""

    path: Path
    url: str
    _db: sqlite3.Connection
    _q: dict[str, str]

    def __init__(self, path: str | Path, *, create: bool = True, synchronous: str = "FULL", upgrade: bool = False) -> None:
        """`upgrade`: open an older format too, for `upgrade_format` alone (`ledger upgrade`);
        otherwise a ledger in any format but this code's is refused (base.check_format)."""
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self._q = sqlfiles.queries(PACKAGE, "queries.sql")
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA", "OFF"):
            raise UsageError(f"unknown synchronous setting {synchronous!r}")
        if not self.path.exists():
            if not create:
                raise StoreError(f"no ledger at {self.path}", hint="check --store / LEDGER_STORE")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create {self.path.parent}: {exc.strerror}") from exc
        try:
            # A bigger page cache keeps the id and (stream, version) indexes in memory during
            # batched appends. No mmap: it made a full scan count the whole file in RSS and
            # bought nothing measurable for sequential reads.
            self._db = connect(self.path, cache_kib=65536)
            self._use_wal()
            self._db.execute(f"PRAGMA synchronous = {synchronous.upper()}")
            self._init_schema(create, upgrade)
        except sqlite3.DatabaseError as exc:
            with contextlib.suppress(Exception):
                self._db.close()
            raise StoreError(
                f"cannot open ledger {self.path}: {exc}",
                hint="is it a tpu-ledger SQLite file, readable, and not locked by a crashed tool?",
            ) from exc

    # -- set-up ---------------------------------------------------------------------------
    def _use_wal(self) -> None:
        """Switch a new file to WAL. The switch needs an exclusive lock and SQLite does not
        wait for it through the busy handler, so two openers of a brand-new ledger (a
        writer and a reader thread, say) retry that moment instead of failing."""
        deadline = time.monotonic() + 30
        while True:
            try:
                if self._db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _format(self) -> str | None:
        with contextlib.suppress(sqlite3.OperationalError):  # a new file: no meta table yet
            row = self._db.execute(self._q["format"]).fetchone()
            return row[0] if row else None
        return None

    def _init_schema(self, create: bool, upgrade: bool) -> None:
        found = self._format()
        if found is not None:
            check_format(found, str(self.path), upgrade=upgrade)
            return
        tables = {r[0] for r in self._db.execute(self._q["tables"])}
        if tables - TABLES:
            raise StoreError(f"{self.path} is an SQLite database but not a tpu-ledger ledger",
                             hint="point --store / LEDGER_STORE at a ledger file")
        if not create and not tables:
            raise StoreError(f"no ledger at {self.path} (an empty file)", hint="check --store / LEDGER_STORE")
        with self._tx():
            # Re-read under the write lock: another process may have created it meanwhile.
            if self._format() is None:
                self._run("schema.sql", "triggers.sql")
                self._db.execute(self._q["set_format"], (str(FORMAT_VERSION),))

    def upgrade_format(self, *, dry_run: bool = False, force: bool = False) -> tuple[int, int]:
        """Bring an older format to this code's, in place, in one transaction (a crash or a
        failure leaves the old format whole): triggers, indexes and the snapshot cache are
        replaced, events never touched. (from, to); from == to when nothing was to do.
        `dry_run` runs the same transaction and rolls it back. Refused while a lease is held
        (a running reconciler), unless `force`."""
        try:
            with self._tx():
                found = int(self._format() or FORMAT_VERSION)
                if check_format(found, str(self.path), upgrade=True):
                    if not force and "leases" in {r[0] for r in self._db.execute(self._q["tables"])}:
                        holders = [r[0] for r in self._db.execute(self._q["live_holders"], (time.time(),))]
                        check_no_holders(holders, str(self.path))
                    # Every step from the format found (upgrade-N.sql: N -> N + 1), as PostgreSQL does.
                    self._run(*(f"upgrade-{n}.sql" for n in range(found, FORMAT_VERSION)), "schema.sql", "triggers.sql")
                    self._db.execute(self._q["set_format"], (str(FORMAT_VERSION),))
                if dry_run:
                    raise _RollBack
        except _RollBack:
            pass
        except sqlite3.OperationalError as exc:
            raise StoreError(f"cannot upgrade ledger {self.path}: {exc}",
                             hint="it needs write access to the file and its folder; the old format is intact") from exc
        return found, FORMAT_VERSION

    def _run(self, *filenames: str) -> None:
        for filename in filenames:
            for statement in statements(sqlfiles.script(PACKAGE, filename)):
                self._db.execute(statement)

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return write_transaction(self._db, self.path)

    def close(self) -> None:
        self._db.close()
