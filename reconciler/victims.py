"""Whom to preempt: the running jobs that free enough chips while losing the least. Pure."""

from __future__ import annotations

from ledger.fold import JobState
from reconciler.needs import Need, need_of
from reconciler.rules import decide


def job_chips(job: JobState) -> int:
    """The chips the job holds or asks for (0 when its type is unknown)."""
    return (need_of(job) or Need("", 0)).chips


def resumes(job: JobState) -> bool:
    """Would the job come back after a preemption (its `on_preempted` rule, its restart
    budget)? A job whose rule is `pass` would end for good: it is never chosen as a victim."""
    return decide(job.spec, "preempted", job.restarts, tpu_usable=False).rule not in ("pass", "exhausted")


def _last_save(job: JobState) -> str:
    """When the job last saved its work: its latest checkpoint, else when it started."""
    return max(job.times.get("checkpointed", ""), job.times.get("started", ""))


def choose_victims(candidates: list[JobState], short: int) -> list[JobState]:
    """The fewest chips wasted that free at least `short` chips, then the most recent
    checkpoint first; never a victim that is not needed. [] when they cannot free enough."""
    if short <= 0:
        return []
    # Most recent save first, then the later submission (it has run the least), then the id.
    order = sorted(candidates, key=lambda j: (_last_save(j), j.submitted_seq, j.id), reverse=True)
    singles = [j for j in order if job_chips(j) >= short]
    if singles:
        return [min(singles, key=lambda j: (job_chips(j), order.index(j)))]
    picked: list[JobState] = []
    total = 0
    for j in sorted(order, key=lambda j: -job_chips(j)):  # the biggest first: fewest victims
        picked.append(j)
        total += job_chips(j)
        if total >= short:
            break
    if total < short:
        return []
    for j in sorted(picked, key=job_chips):  # then drop whoever is not needed, the smallest first
        if total - job_chips(j) >= short:
            picked.remove(j)
            total -= job_chips(j)
    return picked
