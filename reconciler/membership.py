"""Spreading jobs over several reconcilers that share one ledger.

Each reconciler holds a `member:<id>` lease while it lives, and a `job:<id>` lease on every
job it acts on. A job nobody holds goes to its preferred live member (rendezvous hashing:
every member computes the same answer, and a member's death moves only its own jobs). A
dead member's leases lapse within the TTL; its jobs, unfinished intents included, are then
claimed by the others. Leases spread the work; the ledger's expected versions stay the fence.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable

from ledger.store import open_leases
from ledger.store.leases import LeaseKeeper

MEMBER_PREFIX = "member:"
JOB_PREFIX = "job:"


def preferred(job_id: str, members: Iterable[str]) -> str | None:
    """The member that should take a free job: highest hash of (member, job). Pure."""
    return max(members, key=lambda m: hashlib.sha1(f"{m}\x00{job_id}".encode()).digest(), default=None)


class Membership:
    def __init__(self, store_url: str, holder: str, ttl: float) -> None:
        self.holder = holder
        self.ttl = ttl
        self.keeper = LeaseKeeper(lambda: open_leases(store_url), holder, ttl=ttl)
        self._reader = open_leases(store_url)
        self._members: list[str] = [holder]
        self._members_at = 0.0
        self.keeper.claim(MEMBER_PREFIX + holder)

    def members(self) -> list[str]:
        """Live members, refreshed a few times per TTL (one query)."""
        now = time.monotonic()
        if now - self._members_at > self.ttl / 3:
            live = [
                lease.holder for lease in self._reader.all()
                if lease.name.startswith(MEMBER_PREFIX) and lease.live
            ]
            self._members = sorted(set(live) | {self.holder})
            self._members_at = now
        return self._members

    def may_act(self, job_id: str, *, adopting: bool = False) -> bool:
        """True when this reconciler holds the job's lease or has just won it."""
        name = JOB_PREFIX + job_id
        if self.keeper.holds(name):
            return True
        if not adopting and preferred(job_id, self.members()) != self.holder:
            return False
        return self.keeper.claim(name)

    def adopt(self, job_id: str) -> bool:
        """Try to take a job whose unfinished intent names another holder: succeeds only
        once that holder's lease has lapsed."""
        return self.may_act(job_id, adopting=True)

    def let_go(self, job_id: str) -> None:
        if self.keeper.holds(JOB_PREFIX + job_id):
            self.keeper.release(JOB_PREFIX + job_id)

    def close(self) -> None:
        self.keeper.release(MEMBER_PREFIX + self.holder)
        self.keeper.close()
        self._reader.close()
