"""What a chaos run does and when: its settings, and the fault schedule drawn from its seed.

Pure: the same `Scenario` always gives the same schedule, so a run that broke an invariant
can be replayed with its seed. Each kind of fault has its own clock (a gap drawn uniformly
from its range after the previous one), and every fault falls inside the fault window
[0, duration); faults that last (a capacity drop) end inside it too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Seconds between two faults of one kind: (shortest, longest) gap.
KILL_RECONCILER = (3.0, 8.0)
KILL_WATCHER = (15.0, 30.0)
PREEMPT = (8.0, 15.0)
KILL_HOST = (20.0, 40.0)
CAPACITY_DROP = (30.0, 60.0)
CAPACITY_DROP_LASTS = (4.0, 10.0)
FAIL_OPERATION = (20.0, 40.0)
FAIL_CREATION = (25.0, 50.0)
# A capacity schedule over the fault window: spot v4 in the jobs' zone runs out for a while in
# every period (the jobs with fallbacks move to their other zone; the others wait and probe).
SCHEDULE_PERIOD = 30.0
SCHEDULE_OUT = 8.0
# The whole TPU API down (every call refused UNAVAILABLE) for a while.
OUTAGE = (30.0, 60.0)
OUTAGE_LASTS = (4.0, 12.0)
# The next create refused PERMISSION_DENIED (its job is blocked); an operator grants the role
# and runs `ledger resume` on the blocked jobs `lasts` seconds later.
PERMISSION = (25.0, 50.0)
PERMISSION_LASTS = (3.0, 8.0)

# Fault kinds, in the order a report lists them.
KINDS = ("kill_reconciler", "kill_watcher", "preempt", "kill_host", "capacity_drop", "fail_operation", "fail_creation",
         "outage", "permission")


@dataclass(frozen=True)
class Scenario:
    duration: float = 120.0        # the fault window, seconds
    seed: int = 1
    jobs: int = 6
    store: str = "sqlite"          # or "postgres"
    reconcilers: int = 1           # 2 on PostgreSQL: they share the jobs through leases
    settle: float = 240.0          # how long everything may take to settle after the window
    observe: float = 10.0          # seconds watched after settling, for orphaned TPUs
    # Seconds of work in each job, as fractions of the window: the jobs run through the faults.
    job_work: tuple[float, float] = (0.3, 0.6)
    max_restarts: int = 20
    lease_ttl: float = 3.0
    orphan_grace: float = 5.0
    kinds: tuple[str, ...] = KINDS
    capacity_schedule: bool = True  # spot v4 comes and goes over the window (the emulator's schedule)


@dataclass(frozen=True)
class Fault:
    at: float                      # seconds after the window opened
    kind: str
    target: int = 0                # which reconciler, for kill_reconciler
    lasts: float = 0.0             # for capacity_drop and outage; permission: until the resume
    pick: float = 0.0              # a uniform draw in [0, 1) that chooses among nodes at fault time

    def to_dict(self) -> dict:
        return {"at": round(self.at, 3), "kind": self.kind, "target": self.target, "lasts": round(self.lasts, 3)}


@dataclass
class JobPlan:
    name: str
    seconds: int
    batch: int                     # commits land in batches, so the watcher works during the kills


@dataclass
class Plan:
    faults: list[Fault] = field(default_factory=list)
    jobs: list[JobPlan] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)  # when each batch of jobs is pushed
    capacity: list[dict] = field(default_factory=list)  # the emulator's capacity schedule, from the window's start


def _clock(rng: random.Random, kind: str, gap: tuple[float, float], end: float, **kw) -> list[Fault]:
    out, t = [], rng.uniform(*gap) / 2  # the first fault comes sooner than a full gap
    while t < end:
        out.append(Fault(at=t, kind=kind, pick=rng.random(), **{k: v(rng) for k, v in kw.items()}))
        t += rng.uniform(*gap)
    return out


def plan(s: Scenario) -> Plan:
    """The schedule: faults sorted by time, the jobs and when their batches are pushed."""
    if s.duration <= 0 or s.jobs <= 0 or s.reconcilers <= 0:
        raise ValueError("duration, jobs and reconcilers must be positive")
    rng = random.Random(s.seed)
    faults: list[Fault] = []
    gaps = {"kill_reconciler": KILL_RECONCILER, "kill_watcher": KILL_WATCHER, "preempt": PREEMPT,
            "kill_host": KILL_HOST, "fail_operation": FAIL_OPERATION, "fail_creation": FAIL_CREATION}
    lasting = {"capacity_drop": (CAPACITY_DROP, CAPACITY_DROP_LASTS), "outage": (OUTAGE, OUTAGE_LASTS),
               "permission": (PERMISSION, PERMISSION_LASTS)}
    for kind in s.kinds:
        if kind in lasting:
            gap, lasts = lasting[kind]
            faults += _clock(rng, kind, gap, s.duration - lasts[1], lasts=lambda r, lasts=lasts: r.uniform(*lasts))
        elif kind == "kill_reconciler":
            faults += _clock(rng, kind, gaps[kind], s.duration, target=lambda r: r.randrange(s.reconcilers))
        elif kind in ("fail_operation", "fail_creation"):
            # An armed failure waits for the next call: armed early enough to be spent in the window.
            faults += _clock(rng, kind, gaps[kind], s.duration * 0.8)
        elif kind in gaps:
            faults += _clock(rng, kind, gaps[kind], s.duration)
        else:
            raise ValueError(f"unknown fault kind {kind!r}; one of {', '.join(KINDS)}")
    faults.sort(key=lambda f: f.at)
    # Jobs arrive in up to three batches over the first half of the window.
    batches = [0.0] + [s.duration * k / 6 for k in (1, 2)][: max(0, min(2, s.jobs - 1))]
    jobs = [JobPlan(name=f"j{i:02d}", seconds=max(5, round(s.duration * rng.uniform(*s.job_work))), batch=i % len(batches))
            for i in range(s.jobs)]
    return Plan(faults=faults, jobs=jobs, batches=batches, capacity=capacity_steps(s, rng))


def capacity_steps(s: Scenario, rng: random.Random, zone: str = "us-central2-b") -> list[dict]:
    """Spot v4 in `zone` out for SCHEDULE_OUT seconds in every SCHEDULE_PERIOD of the window
    (at a drawn offset), back to the default at the window's end at the latest."""
    if not s.capacity_schedule:
        return []
    steps, t = [], rng.uniform(0, SCHEDULE_PERIOD / 2)
    while t + SCHEDULE_OUT < s.duration:
        steps += [{"at": round(t, 3), "zone": zone, "family": "v4", "pricing": "spot", "chips": 0},
                  {"at": round(t + SCHEDULE_OUT, 3), "zone": zone, "family": "v4", "pricing": "spot", "chips": None}]
        t += SCHEDULE_PERIOD
    return steps
