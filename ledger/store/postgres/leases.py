"""The shared ledger's leases (ledger/store/leases.py): the `leases` table of the ledger's
schema, judged by the database server's clock."""

from __future__ import annotations

from ledger.store.leases import Lease, check_lease
from ledger.store.postgres.database import SideTable


class PostgresLeases(SideTable):
    queries_file = "leases.sql"

    def _changed(self, query: str, name: str, holder: str, ttl: float | None = None) -> bool:
        return bool(self._db.execute(self._q[query], {"name": name, "holder": holder, "ttl": ttl}))

    def acquire(self, name: str, holder: str, ttl: float) -> bool:
        check_lease(holder, ttl)
        return self._changed("acquire", name, holder, float(ttl))

    def renew(self, name: str, holder: str, ttl: float) -> bool:
        check_lease(holder, ttl)
        return self._changed("renew", name, holder, float(ttl))

    def release(self, name: str, holder: str) -> bool:
        check_lease(holder)
        return self._changed("release", name, holder)

    def get(self, name: str) -> Lease | None:
        rows = self._db.execute(self._q["get"], {"name": name})
        return Lease(*rows[0]) if rows else None

    def all(self) -> list[Lease]:
        return [Lease(*r) for r in self._db.execute(self._q["all"])]
