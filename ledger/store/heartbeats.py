"""Heartbeats: which service instances live, written beside the events, never in them.

Every long-running command (`ledger watch`, `reconcile`, `fanout`, `notify`, `dashboard`)
writes one row for itself every few seconds: its instance id, component, host, pid, version,
when it started, its last beat and whether it holds its lease. `ledger status` and the
dashboard list them and mark as dead an instance whose last beat is older than
`defaults.HEARTBEAT_DEAD_S`; one that stopped cleanly says so. Heartbeats are not ledger
events: a beat every few seconds would bloat the ledger and say nothing worth auditing.

The table is created where it is missing (`CREATE TABLE IF NOT EXISTS`): older code never
reads it and the store's format does not change. Like leases, a beat is judged by one clock:
the database server's for PostgreSQL, this host's for SQLite.

Each backend keeps its SQL (`heartbeats.sql`); `ledger.store.open_heartbeats` opens the one
of a URL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

ALIVE, DEAD, STOPPED = "alive", "dead", "stopped"


@dataclass(frozen=True, slots=True)
class Beat:
    """What an instance says of itself at each beat."""

    instance: str
    component: str
    host: str
    pid: int
    version: str
    started: float  # seconds since the epoch
    lease_held: bool | None = None  # None: this component holds no lease


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A stored beat, as the judging clock sees it now."""

    instance: str
    component: str
    host: str
    pid: int
    version: str
    started: float
    last_beat: float
    lease_held: bool | None
    stopped: float | None  # when it stopped cleanly (None: it did not say)
    age: float  # seconds since the last beat, by the judging clock

    def state(self, dead_after: float) -> str:
        """alive, dead (no beat for `dead_after` seconds) or stopped (it said so)."""
        if self.stopped is not None:
            return STOPPED
        return DEAD if self.age > dead_after else ALIVE

    def to_dict(self, dead_after: float) -> dict[str, Any]:
        return {**asdict(self), "age": round(self.age, 3), "state": self.state(dead_after)}


class Heartbeats(Protocol):
    def beat(self, beat: Beat) -> None:
        """Record that `beat.instance` lives now (its row created or updated)."""
        ...

    def stop(self, instance: str) -> None:
        """Record that `instance` stopped cleanly."""
        ...

    def all(self) -> list[Heartbeat]:
        """Every instance's row, newest beat first."""
        ...

    def forget(self, older_than: float) -> int:
        """Drop rows whose last beat is older than `older_than` seconds; how many."""
        ...

    def close(self) -> None: ...
