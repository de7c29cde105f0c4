"""/healthz and /readyz: is the process alive, and is it fit to do its work now.

A readiness check is a named function answering `Check(ok, detail)`; `Readiness` runs a
service's checks and says which failed. The checks are cheap by design (a probe may come
every few seconds): the store is asked for its head on the follower's connection, the tail
of the ledger since the last probe is checked (never a full verify), the lease and the last
pass are what the service already knows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ledger.app.observability.collectors import LedgerFollower
from ledger.errors import safe_url
from ledger.store import open_store


@dataclass(frozen=True, slots=True)
class Check:
    ok: bool
    detail: str = ""


class Readiness:
    def __init__(self) -> None:
        self.checks: dict[str, Callable[[], Check]] = {}
        self.last: dict[str, Check] = {}  # the last answers, for the `tpu_ledger_ready` gauge

    def add(self, name: str, check: Callable[[], Check]) -> Readiness:
        self.checks[name] = check
        return self

    def run(self) -> tuple[bool, dict[str, Any]]:
        """(ready, the JSON body /readyz answers): every check, and which failed."""
        results: dict[str, Check] = {}
        for name, check in self.checks.items():
            try:
                results[name] = check()
            except Exception as exc:  # a check that cannot tell is a failed check
                results[name] = Check(False, f"{type(exc).__name__}: {exc}")
        self.last = results
        failed = [name for name, r in results.items() if not r.ok]
        body = {"ready": not failed, "failed": failed,
                "checks": {name: {"ok": r.ok, "detail": r.detail} for name, r in results.items()}}
        return not failed, body


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def store_check(store_url: str) -> Callable[[], Check]:
    """The store answers a new connection (an SQLite file removed under a running service
    still answers the connection it had open)."""

    def check() -> Check:
        try:
            with open_store(store_url, create=False) as store:
                head = store.head()
        except Exception as exc:
            return Check(False, f"cannot read {safe_url(store_url)}: {_first_line(exc)}")
        return Check(True, f"head {head}")

    return check


def sound_check(follower: LedgerFollower) -> Callable[[], Check]:
    """The events appended since this service started check out (verify's row checks)."""

    def check() -> Check:
        try:
            problem = follower.refresh()
        except Exception as exc:
            return Check(False, f"cannot read the ledger's tail: {_first_line(exc)}")
        if problem is None:
            return Check(True, f"tail checked up to seq {follower.tail.after}")
        return Check(False, f"seq {problem.position}: {problem.reason}; run `ledger verify`")

    return check


def recent_check(what: str, last: Callable[[], float | None], max_age: float) -> Callable[[], Check]:
    """`last()` (Unix time) is at most `max_age` seconds ago."""

    def check() -> Check:
        when = last()
        if when is None:
            return Check(False, f"no {what} yet")
        age = time.time() - when
        if age > max_age:
            return Check(False, f"last {what} {age:.0f} s ago (more than {max_age:g} s)")
        return Check(True, f"last {what} {age:.1f} s ago")

    return check
