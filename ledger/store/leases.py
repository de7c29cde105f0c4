"""Leases: who acts on what, for how long. Kept beside the events, never in them.

A lease is a named, time-limited claim (`job:alice/train` held by `reconciler@host-a:4242`
for 15 s). Several reconcilers on one ledger use them to spread jobs and to take over a dead
one's jobs once its leases lapse; expected-version appends stay the fence that makes a late
write by a holder who lost its lease fail.

- `acquire(name, holder, ttl)`: True if `holder` now holds it (it was free, expired, or
  already its own: then it is renewed). Atomic: two contenders never both win.
- `renew(name, holder, ttl)`: True only while `holder` still holds it unexpired; False means
  stop acting on it.
- `release(name, holder)`: True if it was held by `holder`; the lease is free at once.
- `get(name)` / `all()`: the current `Lease` rows (expired ones included, `live` says).

`token` grows by one every time a lease changes hands (fencing token); it never goes back.
Expiry is judged by one clock: the database server's for PostgreSQL (hosts' clocks may
differ), this host's for SQLite (one host by nature).

This module is backend-free: each backend keeps its own lease table and SQL
(`ledger/store/sqlite/leases.py`, `ledger/store/postgres/leases.py`), `ledger.store.open_leases`
opens the one of a URL, and `LeaseKeeper` uses nothing but the `Leases` protocol.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ledger.errors import StoreError


@dataclass(frozen=True, slots=True)
class Lease:
    name: str
    holder: str  # "" once released
    expires_at: float  # seconds since the epoch, by the judging clock
    token: int
    live: bool


class Leases(Protocol):
    def acquire(self, name: str, holder: str, ttl: float) -> bool: ...

    def renew(self, name: str, holder: str, ttl: float) -> bool: ...

    def release(self, name: str, holder: str) -> bool: ...

    def get(self, name: str) -> Lease | None: ...

    def all(self) -> list[Lease]: ...

    def close(self) -> None: ...


def check_lease(holder: str, ttl: float | None = None) -> None:
    if not holder:
        raise StoreError("a lease holder needs a non-empty name")
    if ttl is not None and not ttl > 0:
        raise StoreError(f"lease ttl must be > 0 seconds, got {ttl}")


class LeaseKeeper:
    """Keeps one holder's leases alive: `claim` takes a lease, a thread renews every claimed
    lease each ttl/3, `holds` says whether acting on it is still safe, `release` gives it up.

    `holds` is judged conservatively on this host's monotonic clock: a lease counts as held
    only until ttl minus a margin after the start of the last successful acquire or renew
    request, so a holder cut off from the database stops acting before anyone else can take
    the lease over. Appends with expected versions remain the fence for a write in flight.

    A reconciler uses it as: `if keeper.claim(f"job:{job_id}"): act ...`; and after the
    action, or when the job is done, `keeper.release(...)`. A dead reconciler's jobs are
    claimable by the others at most `ttl` after its last renewal.
    """

    def __init__(self, leases_factory: Callable[[], Leases], holder: str, ttl: float = 15.0, *, margin: float | None = None) -> None:
        check_lease(holder, ttl)
        self.holder = holder
        self.ttl = ttl
        self.margin = margin if margin is not None else ttl / 5
        self._factory = leases_factory
        self._leases = leases_factory()  # for claim/release (the caller's thread)
        self._held: dict[str, float] = {}  # name -> monotonic deadline
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name=f"leases-{holder}", daemon=True)
        self._thread.start()

    def claim(self, name: str) -> bool:
        started = time.monotonic()
        with self._lock:
            ok = self._leases.acquire(name, self.holder, self.ttl)
            if ok:
                self._held[name] = started + self.ttl - self.margin
            else:
                self._held.pop(name, None)
            return ok

    def holds(self, name: str) -> bool:
        with self._lock:
            deadline = self._held.get(name)
        return deadline is not None and time.monotonic() < deadline

    def held(self) -> list[str]:
        now_ = time.monotonic()
        with self._lock:
            return sorted(n for n, d in self._held.items() if d > now_)

    def release(self, name: str) -> None:
        with self._lock:
            self._held.pop(name, None)
            self._leases.release(name, self.holder)

    def _renew_loop(self) -> None:
        leases = None
        try:
            while not self._stop.wait(self.ttl / 3):
                with self._lock:
                    names = list(self._held)
                if not names:  # nothing to renew: no connection opened for nothing
                    continue
                if leases is None:
                    try:
                        leases = self._factory()
                    except Exception:  # unreachable for now: deadlines run out meanwhile
                        continue
                for name in names:
                    started = time.monotonic()
                    try:
                        ok = leases.renew(name, self.holder, self.ttl)
                    except Exception:  # the database is unreachable: the deadline runs out
                        continue
                    with self._lock:
                        if name not in self._held:
                            continue
                        if ok:
                            self._held[name] = started + self.ttl - self.margin
                        else:
                            del self._held[name]  # lost (expired and taken): stop acting on it
        finally:
            close = getattr(leases, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        self._stop.set()
        # A renewal under way ends within its connect and one statement; waiting for it
        # (not just a ttl) means no connection of this keeper outlives close().
        self._thread.join(timeout=max(self.ttl, 30.0))
        with self._lock:
            for name in list(self._held):
                with contextlib.suppress(Exception):  # unreachable: it expires by itself
                    self._leases.release(name, self.holder)
            self._held.clear()
        close = getattr(self._leases, "close", None)
        if close is not None:
            close()
