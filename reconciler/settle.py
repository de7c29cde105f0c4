"""What `reconcile --once` may still wait for. Pure: no I/O.

A pass that plans nothing is not the end of what one call can do: a TPU being created, a
node restarting, or a dead worker the API has not explained yet will let the next step be
planned within seconds, without anyone doing anything. Capacity, a job's own command and
another reconciler's fresh intent are waits of unknown length: `--once` stops for those.
"""

from __future__ import annotations

from collections.abc import Mapping

from ledger import fold
from ledger.fold import JobState
from reconciler import slices
from reconciler.model import Observed

# Node states that end by themselves within an operation's time.
NODE_MOVING = frozenset({"CREATING", "STARTING", "RESTARTING", "REPAIRING", "STOPPING"})
# Queued-resource states on the way to ACTIVE once capacity is granted (not waiting for it).
QR_MOVING = frozenset({"CREATING", "ACCEPTED", "PROVISIONING"})


def awaiting(jobs: Mapping[str, JobState], obs: Observed) -> dict[str, str]:
    """Job id -> the cloud operation under way that its next step waits for."""
    out: dict[str, str] = {}
    for job in jobs.values():
        why = _awaiting(job, obs)
        if why:
            out[job.id] = why
    return out


def _awaiting(job: JobState, obs: Observed) -> str:
    if job.id in obs.suspect_since:
        return "a worker died: waiting for the TPU API to say why"
    if job.pending_action or not job.tpu or job.tpu.get("zone", "") not in obs.zones:
        return ""
    if job.terminal:
        return ""
    name = job.tpu["name"]
    node = slices.observe(job.tpu, obs.nodes)[0]  # a multislice TPU's slices, as one
    if job.state == fold.PROVISIONING:
        if job.tpu.get("kind") == "queued_resource":
            qr = obs.queued.get(name)
            if qr is not None and qr.state in QR_MOVING:
                return f"queued resource {name} is {qr.state}"
            if qr is not None and qr.state != "ACTIVE":
                return ""  # waiting for capacity: no telling how long
        if node is None:
            return f"TPU {name} was asked for and is not listed yet"
    if node is not None and node.state in NODE_MOVING:
        return f"TPU {name} is {node.state}"
    return ""
