"""The shared ledger's heartbeats (ledger/store/heartbeats.py): a table beside the ledger's
schema, judged by the database server's clock."""

from __future__ import annotations

import contextlib

import psycopg
from psycopg import sql

from ledger.store import sqlfiles
from ledger.store.heartbeats import Beat, Heartbeat
from ledger.store.postgres.database import PACKAGE, READER_ROLE, WRITER_ROLE, PgDatabase, SideTable


class PostgresHeartbeats(SideTable):
    queries_file = "heartbeats.sql"

    def __init__(self, db: PgDatabase, *, owns_db: bool = False) -> None:
        super().__init__(db, owns_db=owns_db)
        self._table = f"{db.schema}.heartbeats"
        if not self._exists():
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege):  # a reader: no rows until a service beats
                self._db.execute(self._q["create"])
                self._db.execute(self._grant())

    def _grant(self) -> str:
        conn = self._db.conn
        return self._db.render(sqlfiles.queries(PACKAGE, "heartbeats.sql")["grant"],
                               role=sql.Literal(WRITER_ROLE).as_string(conn), role_id=sql.Identifier(WRITER_ROLE).as_string(conn),
                               reader=sql.Literal(READER_ROLE).as_string(conn),
                               reader_id=sql.Identifier(READER_ROLE).as_string(conn))

    def _exists(self) -> bool:
        return bool(self._db.execute(self._q["exists"], {"table": self._table})[0][0])

    def beat(self, beat: Beat) -> None:
        self._db.execute(self._q["beat"], {
            "instance": beat.instance, "component": beat.component, "host": beat.host, "pid": beat.pid,
            "version": beat.version, "started": beat.started, "lease_held": beat.lease_held,
        })

    def stop(self, instance: str) -> None:
        self._db.execute(self._q["stop"], {"instance": instance})

    def all(self) -> list[Heartbeat]:
        if not self._exists():
            return []
        return [Heartbeat(*row) for row in self._db.execute(self._q["all"])]

    def forget(self, older_than: float) -> int:
        return len(self._db.execute(self._q["forget"], {"older_than": float(older_than)}))
