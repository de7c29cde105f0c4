"""The placement step: which of a job's choices to try now, or why it waits. Pure: no I/O.

`choose(job, memory, now_us, probing)` reads the job's choices (ledger.spec.placement), its
failover rules, the lab-wide capacity memory (ledger.capacity: stockouts per zone, type and
pricing, and the job's own round of tries) and the keys other jobs probe this pass:

1. A round starts at choice 0 (`prefer_first`, or the job never ran) or at the choice the job
   last ran on, and goes on in order, wrapping around.
2. A choice is **spent** for the job when its own stockouts there reach `failover.stockouts`,
   or `failover.wait_s` passed since its first one. A key the memory knows is out of
   capacity counts as one stockout for a job that has not tried it this round (with the
   default of 1, a job skips a zone another job just found empty).
3. The first choice that is not spent is tried; if its key is known to be out of capacity
   the job waits for the key's next probe, and one job only (the first asked) probes it.
4. When every choice is spent, the job probes the first key whose probe is due and that no
   other job probes this pass; else it waits for the soonest next probe.

The reasons are what `ledger queue`, `inspect` and the dashboard show.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from ledger import fold
from ledger.capacity import CapacityMemory, Key, Stockouts, key_of
from ledger.fold import JobState
from ledger.spec.placement import Choice, failover, placements

_US = 1_000_000
# How a Hold's reason begins (recorded in `queued`): the planner knows such a job waited on the
# capacity memory, not on a retry of its own.
HOLD = "waiting for capacity"


@dataclass(frozen=True, slots=True)
class Try:
    """Try `choice` now. `probe`: its key is known out of capacity and this job probes it
    (the caller gives the key to no other job this pass)."""

    choice: Choice
    reason: str = ""
    probe: bool = False


@dataclass(frozen=True, slots=True)
class Hold:
    """Wait: `reason` (stable while nothing changes: recorded once), `detail` with the live
    figures (for views), until `until_us` at the earliest."""

    reason: str
    detail: str
    until_us: int


def choose(job: JobState, memory: CapacityMemory, now_us: int, probing: Collection[Key] = ()) -> Try | Hold | None:
    """The choice `job` tries now, or why it waits; None for a job without choices (a
    shared TPU: its line is kept by the planner)."""
    choices = placements(job.spec)
    if not choices:
        return None
    rules = failover(job.spec)
    tally = memory.tally(job.id)
    ran = memory.ran_on.get(job.id)
    start = 0 if rules["prefer_first"] or ran is None or ran >= len(choices) else ran
    order = choices[start:] + choices[:start]
    wait_us = int(rules["wait_s"] * _US) if rules["wait_s"] else None

    def spent(c: Choice) -> bool:
        own = tally.get(c.index)
        count = own.count if own is not None else 0
        known = memory.stockouts(c.key)
        if own is None and known is not None and known.next_us > now_us:
            count = 1
        if count >= rules["stockouts"]:
            return True
        return wait_us is not None and own is not None and now_us - own.first_us >= wait_us

    passed = []
    for c in order:
        if spent(c):
            passed.append(c)
            continue
        known = memory.stockouts(c.key)
        if known is None:
            return Try(c, _trying(passed, c, memory, now_us))
        if known.next_us <= now_us and c.key not in probing:
            return Try(c, _trying(passed, c, memory, now_us), probe=True)
        return Hold(f"{HOLD}: {c.label()}", _explain(passed + [c], memory, now_us), max(known.next_us, now_us))
    due = [c for c in order if memory.next_probe(c.key) <= now_us and c.key not in probing]
    if due:
        c = due[0]
        return Try(c, _trying([o for o in order if o is not c], c, memory, now_us, probing=True), probe=c.key in memory.keys)
    soonest = min(memory.next_probe(c.key) for c in order)
    label = order[0].label() if len(order) == 1 else "every choice"
    return Hold(f"{HOLD}: {label}", _explain(list(order), memory, now_us), max(soonest, now_us))


def _trying(passed: list[Choice], c: Choice, memory: CapacityMemory, now_us: int, *, probing: bool = False) -> str:
    if not passed and not probing:
        return ""
    verb = "probing" if probing else "trying"
    head = _explain(passed, memory, now_us)
    return f"{head}; {verb} {c.label()}" if head else f"{verb} {c.label()}"


def _explain(choices: list[Choice], memory: CapacityMemory, now_us: int) -> str:
    """One clause per choice the memory knows out of capacity, e.g. "v4-32 spot
    us-central2-b: out of capacity 3 times in 10 min, next probe 14:05:10"."""
    return "; ".join(f"{c.label()}: {describe(found, now_us)}" for c in choices if (found := memory.stockouts(c.key)) is not None)


def describe(found: Stockouts, now_us: int) -> str:
    return _described(found.kind, found.count, found.last_us - found.first_us, found.next_us if found.next_us > now_us else 0)


@functools.lru_cache(maxsize=1024)
def _described(kind: str, count: int, span_us: int, next_us: int) -> str:
    # Every job waiting on one key reads the same words in a pass: made once.
    what = "over quota" if kind == "quota" else "out of capacity"
    times = "once" if count == 1 else f"{count} times in {_span(span_us)}"
    probe = datetime.fromtimestamp(next_us / _US, UTC).strftime("%H:%M:%S") if next_us else "now"
    return f"{what} {times}, next probe {probe}"


def _span(us: int) -> str:
    s = us // _US
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h"


WAITING = frozenset({fold.PENDING, fold.QUEUED, fold.RECOVERING})  # the states in which a job may ask for a TPU


def place_waiting(jobs: Mapping[str, JobState], memory: CapacityMemory, now_us: int,
                  busy: Collection[str] = ()) -> dict[str, Try | Hold]:
    """The placement step for every job that waits for a TPU of its own. A job whose round
    starts at its first choice, with nothing known against that choice, tries it (the common
    case, decided without ranking anyone); the others are asked in queue order (priority,
    then submission), so at most one of them probes a key known out of capacity, and none
    while a create of that key is under way (an intent without its outcome)."""
    probing: set[Key] = set()
    slow = []
    out: dict[str, Try | Hold] = {}
    keys, rounds, ran_on = memory.keys, memory.rounds, memory.ran_on
    # choice list (interned: jobs alike share one) -> (it, its first choice's Try, or None when
    # the memory knows that choice's key): asked once per list this pass, not once per job.
    firsts: dict[int, tuple[tuple[Choice, ...], Try | None]] = {}
    for job in jobs.values():
        intent = job.pending_action
        if intent is not None:
            if intent.get("action") == "provision":
                probing.add(key_of((intent.get("params") or {}).get("tpu") or {}))
            continue
        if job.tpu is not None or job.state not in WAITING or job.cancel_requested or job.id in busy:
            continue
        choices = placements(job.spec)
        if not choices:
            continue
        if job.id not in rounds and not ran_on.get(job.id):
            first = firsts.get(id(choices))
            if first is None or first[0] is not choices:  # kept with the list: its id stays its own
                first = firsts[id(choices)] = (choices, Try(choices[0]) if choices[0].key not in keys else None)
            if first[1] is not None:
                out[job.id] = first[1]
                continue
        slow.append(job)
    slow.sort(key=lambda j: (-j.priority, j.submitted_seq, j.id))
    alike: dict[tuple, Try | Hold | None] = {}  # jobs with the same choices and rules, no round of their own
    for job in slow:
        mine = job.id in rounds
        if not mine:
            rules = failover(job.spec)
            shape = (id(placements(job.spec)), ran_on.get(job.id, 0), rules["stockouts"], rules["wait_s"], rules["prefer_first"])
            if shape in alike:
                got = alike[shape]
                if got is not None:
                    out[job.id] = got
                continue
        got = choose(job, memory, now_us, probing)
        if not mine and not (isinstance(got, Try) and got.probe):
            alike[shape] = got  # a probe is one job's alone
        if got is None:
            continue
        out[job.id] = got
        if isinstance(got, Try) and got.probe:
            probing.add(got.choice.key)
    return out
