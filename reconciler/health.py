"""Is a zone's TPU API answering? When to try it next, and when that is worth recording.

No I/O: the loop tells it each call's result and asks it whether a zone may be tried now.
A failing zone is tried again after a capped, jittered exponential backoff
(google.api_core.retry.exponential_sleep_generator: full jitter, doubling up to the cap), so
an outage costs one call per backoff step however many jobs wait there. Only a failure that
lasts `down_after` seconds is a change worth one record (`api_unreachable`), and the first
success after it is the other (`api_reachable`): a blip records nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from google.api_core.retry import exponential_sleep_generator

from ledger import defaults
from ledger.failures import ApiFailure


@dataclass(frozen=True, slots=True)
class Change:
    """A zone's API became unreachable (`up` False) or reachable again."""

    zone: str
    up: bool
    failure: ApiFailure | None  # the last error (down), or the one the outage began with (up)
    since: float  # when the failing began (epoch seconds)
    down_s: float = 0.0
    calls: int = 0  # calls that failed in the outage


@dataclass(slots=True)
class _Zone:
    since: float
    failure: ApiFailure
    delays: Iterator[float]
    next_try: float
    calls: int = 1
    recorded: bool = False  # its api_unreachable is in the ledger


@dataclass
class ZoneHealth:
    initial: float = defaults.TPU_BACKOFF_INITIAL_S
    maximum: float = defaults.TPU_BACKOFF_MAX_S
    down_after: float = defaults.TPU_DOWN_AFTER_S
    _zones: dict[str, _Zone] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def may_try(self, zone: str, now: float) -> bool:
        """Is a call to this zone due (it is healthy, or its backoff step has passed)?"""
        with self._lock:
            z = self._zones.get(zone)
            return z is None or now >= z.next_try

    def recorded(self, zone: str) -> bool:
        """Is the zone's outage recorded (and logged) already?"""
        with self._lock:
            z = self._zones.get(zone)
            return z is not None and z.recorded

    def failing(self) -> dict[str, ApiFailure]:
        with self._lock:
            return {zone: z.failure for zone, z in self._zones.items()}

    def failed(self, zone: str, failure: ApiFailure, now: float) -> Change | None:
        """A call to `zone` failed: back off. Returns the change to record, if it is one."""
        with self._lock:
            z = self._zones.get(zone)
            if z is None:
                delays = exponential_sleep_generator(self.initial, self.maximum)
                z = self._zones[zone] = _Zone(now, failure, delays, now + next(delays))
            else:
                z.failure, z.calls, z.next_try = failure, z.calls + 1, now + next(z.delays)
            if z.recorded or now - z.since < self.down_after:
                return None
            z.recorded = True
            return Change(zone, False, failure, z.since, now - z.since, z.calls)

    def succeeded(self, zone: str, now: float) -> Change | None:
        """A call to `zone` succeeded: it is healthy again (a change, if its outage was recorded)."""
        with self._lock:
            z = self._zones.pop(zone, None)
        if z is None or not z.recorded:
            return None
        return Change(zone, True, z.failure, z.since, max(0.0, now - z.since), z.calls)

    def recorded_down(self, zone: str, failure: ApiFailure, since: float, now: float) -> None:
        """The ledger says `zone` was unreachable when this process started (a restart during
        an outage): its outage is not recorded twice, and its end will be."""
        with self._lock:
            delays = exponential_sleep_generator(self.initial, self.maximum)
            self._zones[zone] = _Zone(since, failure, delays, now, calls=0, recorded=True)

    def names(self) -> list[str]:
        """The zones (or keys) failing now."""
        with self._lock:
            return list(self._zones)

    def forget(self, names: Iterable[str]) -> None:
        """Drop what is known of `names` (keys nothing will be tried for again: a job that ended)."""
        with self._lock:
            for name in names:
                self._zones.pop(name, None)

    def wake(self) -> None:
        """The endpoint is back (the channel reconnected): every failing zone may be tried now."""
        with self._lock:
            for z in self._zones.values():
                z.next_try = 0.0
