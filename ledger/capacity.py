"""The lab-wide capacity memory: a fold of the stockouts the ledger recorded. Pure, incremental.

Every stockout (or zone-quota refusal) of a create is a `queued` event of the capacity path:
its `api` says which kind (`stockout`, `quota`: ledger.failures) and its `placement` where
(zone, accelerator, pricing, and `index`: the job's choice). Folded over the whole ledger,
they say for each **(zone, accelerator, pricing)**: how many stockouts in a row since a TPU
was last created there, the first and last of them, the API's last code and message, and
when the next create may probe it again (`last + min(base * 2^(n-1), max)`). A TPU created
there (`provisioning`) clears it: the capacity is back.

Per job it keeps the current **round** of tries (from a submission or a recovery until a TPU
is created): its stockouts per choice, and the choice its last attempt ran on. The placement
step (reconciler.placement) decides from these; `ledger queue`, `inspect` and the dashboard
explain by them. Feed it rows in seq order, as the job fold and the usage fold are fed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from ledger import defaults
from ledger.failures import CAPACITY

Key = tuple[str, str, str]  # (zone, accelerator, pricing)
_TYPES = frozenset({"queued", "provisioning", "submitted", "spec_updated", "resumed", "rerun",
                    "finished", "cancelled", "failed"})
_US = 1_000_000


def is_stockout(data: Mapping[str, Any]) -> bool:
    """Is this `queued` event's data a create refused for capacity (a stockout, or a zone's
    quota) at a placement: one the memory counts, and paces the job by."""
    api, where = data.get("api"), data.get("placement")
    return isinstance(api, Mapping) and api.get("kind") in CAPACITY and isinstance(where, Mapping)


@dataclass(slots=True)
class Stockouts:
    """Stockouts in a row of one (zone, accelerator, pricing), since a TPU was last created there.
    `steps`: how many of them were probes when one was due (the backoff's exponent); the
    creates asked at once before anyone knew (a burst of jobs) count once."""

    count: int
    first_us: int
    last_us: int
    next_us: int  # when a create may probe it again
    code: str = ""
    message: str = ""
    kind: str = "stockout"  # or quota
    steps: int = 0


@dataclass(slots=True)
class Tally:
    """One job's stockouts on one of its choices in the current round."""

    count: int
    first_us: int
    last_us: int


@dataclass(slots=True)
class CapacityMemory:
    backoff_us: int = int(defaults.CAPACITY_BACKOFF_S * _US)
    backoff_max_us: int = int(defaults.CAPACITY_BACKOFF_MAX_S * _US)
    keys: dict[Key, Stockouts] = field(default_factory=dict)
    rounds: dict[str, dict[int, Tally]] = field(default_factory=dict)  # job -> choice -> its stockouts
    ran_on: dict[str, int] = field(default_factory=dict)  # job -> the choice its last TPU was
    moved: set[str] = field(default_factory=set)  # jobs whose TPU is another choice than the one before
    position: int = 0

    # -- reading ------------------------------------------------------------------------
    def stockouts(self, key: Key) -> Stockouts | None:
        return self.keys.get(key)

    def next_probe(self, key: Key) -> int:
        """When a create of `key` may be tried (us; 0: now, nothing is known against it)."""
        found = self.keys.get(key)
        return found.next_us if found is not None else 0

    def tally(self, job_id: str) -> Mapping[int, Tally]:
        return self.rounds.get(job_id, {})

    # -- feeding ------------------------------------------------------------------------
    def apply(self, stream: str, type_: str, time: str, data: Mapping[str, Any], seq: int = 0) -> None:
        """One event, its data decoded."""
        self.apply_rows(((seq, stream, 0, type_, time, data),), decoded=True)

    def apply_rows(self, rows: Iterable[tuple], *, decoded: bool = False) -> CapacityMemory:
        """(seq, stream, version, type, time, data) rows, as the store's `fold_rows` yields
        them; only the few types it reads are decoded."""
        loads = _as_is if decoded else msgspec.json.decode
        seq = 0
        try:
            for seq, stream, _version, type_, time_, data in rows:  # noqa: B007 (the last one is kept)
                if type_ in _TYPES and stream[:1] != "_":
                    self._event(stream, type_, time_, loads(data))
        finally:
            if seq:
                self.position = seq
        return self

    def tee(self, rows: Iterable[tuple]) -> Iterable[tuple]:
        """Pass store rows through, folding them on the way (the loop feeds the job fold
        and this memory from one read)."""
        types, event, loads = _TYPES, self._event, msgspec.json.decode
        for row in rows:
            if row[3] in types and row[1][:1] != "_":
                data = row[5]
                event(row[1], row[3], row[4], loads(data) if isinstance(data, str | bytes) else data)
            self.position = row[0]
            yield row

    def _event(self, job: str, type_: str, time: str, d: Mapping[str, Any]) -> None:
        if type_ == "queued":
            if is_stockout(d):
                self._stockout(job, _us(time), d["api"], d["placement"])
        elif type_ == "provisioning":
            tpu = d.get("tpu")
            if isinstance(tpu, Mapping) and not tpu.get("shared"):
                self._created(tpu)
                index = tpu.get("placement", 0)
                index = index if type(index) is int else 0
                before = self.ran_on.get(job)
                if before is not None and before != index:
                    self.moved.add(job)
                else:
                    self.moved.discard(job)
                self.ran_on[job] = index
                self.rounds.pop(job, None)
        elif type_ in ("resumed", "rerun", "spec_updated"):
            self.rounds.pop(job, None)  # a new round: the placement step starts it afresh
        elif type_ == "submitted" or type_ in ("finished", "cancelled") or type_ == "failed" and d.get("final"):
            self.rounds.pop(job, None)
            self.ran_on.pop(job, None)
            self.moved.discard(job)

    def _stockout(self, job: str, t: int, api: Mapping[str, Any], where: Mapping[str, Any]) -> None:
        key = key_of(where)
        found = self.keys.get(key)
        if found is None:
            found = self.keys[key] = Stockouts(0, t, t, t)
        found.count += 1
        found.last_us = max(found.last_us, t)
        if t >= found.next_us:  # a probe that was due (or the first): the next waits longer
            found.steps += 1
            found.next_us = t + min(self.backoff_us * 2 ** min(found.steps - 1, 30), self.backoff_max_us)
        found.code, found.message, found.kind = str(api.get("code", "")), str(api.get("message", ""))[:300], str(api.get("kind"))
        index = where.get("index", 0)
        index = index if type(index) is int else 0
        tallies = self.rounds.setdefault(job, {})
        tally = tallies.get(index)
        if tally is None:
            tallies[index] = Tally(1, t, t)
        else:
            tally.count += 1
            tally.last_us = max(tally.last_us, t)

    def _created(self, tpu: Mapping[str, Any]) -> None:
        zone, accelerator, pricing = str(tpu.get("zone", "")), str(tpu.get("accelerator", "")), tpu.get("pricing")
        if pricing is not None:
            self.keys.pop((zone, accelerator, str(pricing)), None)
        else:  # written before TPUs named their pricing: the capacity of that type there is back
            for key in [k for k in self.keys if k[0] == zone and k[1] == accelerator]:
                del self.keys[key]


def key_of(where: Mapping[str, Any]) -> Key:
    """The memory's key of a placement (an event's `placement`, or a `Choice`'s fields)."""
    return str(where.get("zone", "")), str(where.get("accelerator", "")), str(where.get("pricing") or "ondemand")


def _us(time: str) -> int:
    moment = datetime.fromisoformat(time)
    return int(moment.timestamp() * _US)


def _as_is(data: Any) -> Any:
    return data
