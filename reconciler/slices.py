"""A job's TPU as a list of slices, for the planner: what its nodes say together, and which
host a rank is. Pure: no I/O.

A one-slice TPU is its node. A multislice TPU (one queued resource `name`) is its nodes
`name-0` .. `name-(N-1)`: it is READY when every slice is, and lost when any slice is (a
slice lost is the job's attempt lost: docs/placement.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledger.events import data as ev
from ledger.fold import JobState
from ledger.placement import held, slice_nodes, slices_of
from ledger.spec.placement import placed_spec
from reconciler.model import NODE_GONE_STATES, NODE_READY, NodeObs
from reconciler.remote.types import Placed

# Health values that do not explain a dead worker: a TIMEOUT or an unhealthy node does.
UNEXPLAINED_HEALTH = frozenset({"", "HEALTHY", "HEALTH_UNSPECIFIED"})


def observe(tpu: Mapping[str, Any], nodes: Mapping[str, NodeObs]) -> tuple[NodeObs | None, int | None]:
    """The node that speaks for the whole TPU, and the slice it is when that matters: the
    first slice gone (None) or PREEMPTED/TERMINATED, else the first not READY, else the
    first whose health explains trouble, else slice 0 (slice None for a one-slice TPU)."""
    names = slice_nodes(tpu)
    if len(names) == 1:
        return nodes.get(names[0]), None
    found = [nodes.get(n) for n in names]
    for i, node in enumerate(found):
        if node is None or node.state in NODE_GONE_STATES:
            return node, i
    for i, node in enumerate(found):
        if node is not None and node.state != NODE_READY:
            return node, i
    for i, node in enumerate(found):
        if node is not None and node.health not in UNEXPLAINED_HEALTH:
            return node, i
    return found[0], None


def lost_event(tpu: Mapping[str, Any], node: NodeObs | None, lost: int | None, attempt: int, why: str = "") -> ev.Preempted:
    """The `preempted` event of a TPU that `observe` found gone (`node` None) or preempted:
    named by its lost slice's node for a multislice TPU, `why` after the state."""
    state = node.state if node is not None else "DELETED"
    names = slice_nodes(tpu)
    name = node.name if node is not None else names[lost] if lost is not None and lost < len(names) else str(tpu.get("name"))
    which = {"slice": lost} if lost is not None else {}
    return ev.Preempted(tpu_state=state, reason=f"TPU {name} is {state}" + (f": {why}" if why else ""), attempt=attempt,
                        **which)  # type: ignore[arg-type]


def alive(tpu: Mapping[str, Any], nodes: Mapping[str, NodeObs]) -> list[int]:
    """The slices whose node is still READY: where a command may still run."""
    return [i for i, n in enumerate(slice_nodes(tpu)) if (node := nodes.get(n)) is not None and node.state == NODE_READY]


def multislice(job: JobState) -> bool:
    return slices_of(job.tpu) > 1


def host(job: JobState, rank: int) -> dict[str, int]:
    """A rank as the events name a host: {worker} for a one-slice job, {worker, slice} else."""
    hosts = job.hosts
    if not multislice(job) or not 0 <= rank < len(hosts):
        return {"worker": rank}
    h = hosts[rank]
    return {"worker": int(h.get("worker", rank)), "slice": int(h.get("slice", 0))}


def host_text(job: JobState, rank: int) -> str:
    h = host(job, rank)
    return f"slice {h['slice']} worker {h['worker']}" if "slice" in h else f"worker {h['worker']}"


def host_key(job: JobState, rank: int) -> str:
    """How `started` and `finished` key a host: "w", or "s/w" for a multislice job."""
    h = host(job, rank)
    return f"{h['slice']}/{h['worker']}" if "slice" in h else str(h["worker"])


def spec_of(job: JobState) -> dict[str, Any]:
    """The spec as the job runs on the choice its TPU is (its own gcsfuse and args)."""
    return placed_spec(job.spec, int((job.tpu or {}).get("placement", 0) or 0))


def placed_of(job: JobState) -> Placed:
    """Where the job's attempt runs, as its command's environment says (reconciler.remote):
    the choice, and for a multislice TPU the Megascale coordinator, worker 0 of slice 0 by
    the address the hosts reach each other by."""
    tpu = job.tpu or {}
    fp = held(tpu)
    first = next((h for h in job.hosts if h.get("slice", 0) == 0 and h.get("worker") == 0), None) or {}
    pricing = tpu.get("pricing") or (job.spec.get("tpu") or {}).get("pricing", "")
    return Placed(accelerator=str(tpu.get("accelerator", "")), zone=str(tpu.get("zone", "")), pricing=str(pricing),
                  chips=fp.chips if fp else 0, index=int(tpu.get("placement", 0) or 0), slices=slices_of(tpu),
                  coordinator=str(first.get("internal_address") or first.get("address") or ""))
