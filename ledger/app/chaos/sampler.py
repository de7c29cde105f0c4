"""What the cloud holds, sampled: every node with its state and the job its labels name.

A background thread lists the nodes of every zone the jobs may use (their fallbacks' too)
through the real TPU client every `every` seconds. From the samples: how often one job held
two live TPUs at once (double provisioning: two TPUs, in one zone or across zones; the
slices of one multislice TPU are one TPU), and how many TPU-seconds nodes existed after the
ledger said every job had let its TPU go (orphans, in any zone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ledger import defaults
from reconciler import naming
from reconciler.tpu import TpuApi

# A node in one of these states is running (or about to run) a VM someone pays for.
LIVE_STATES = frozenset({"CREATING", "READY", "RESTARTING", "REIMAGING", "REPAIRING", "STARTING", "STOPPING"})


@dataclass(frozen=True)
class NodeSeen:
    name: str
    state: str
    job: str        # the job label's slug, or "" for a node no job labelled
    job_hash: str
    tpu: str = ""   # the TPU it belongs to: zone/its queued resource for a slice, else zone/its name


@dataclass(frozen=True)
class Sample:
    t: float        # time.time()
    nodes: tuple[NodeSeen, ...]

    def doubles(self) -> dict[str, list[str]]:
        """Jobs with two or more live TPUs in this sample: job -> node names."""
        by_job: dict[str, dict[str, list[str]]] = {}
        for n in self.nodes:
            if n.state in LIVE_STATES and n.job_hash:
                by_job.setdefault(n.job_hash, {}).setdefault(n.tpu or n.name, []).append(n.name)
        return {self._job_of(h): sorted(x for names in tpus.values() for x in names)
                for h, tpus in by_job.items() if len(tpus) > 1}

    def _job_of(self, job_hash: str) -> str:
        return next((n.job for n in self.nodes if n.job_hash == job_hash), job_hash)


class Sampler:
    def __init__(self, endpoint: str, zones: Sequence[str], every: float = 0.5) -> None:
        self.api = TpuApi(defaults.PROJECT, endpoint)
        self.zones = tuple(zones)
        self.every = every
        self.samples: list[Sample] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def take(self) -> Sample:
        nodes = tuple(
            NodeSeen(n.name, n.state, n.labels.get(naming.LABEL_JOB, ""), n.labels.get(naming.LABEL_JOB_HASH, ""),
                     f"{zone}/{n.queued_resource or n.name}")  # a slice is its queued resource's
            for zone in self.zones for n in self.api.list_nodes(zone))
        return Sample(time.time(), nodes)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.take())
            except Exception:  # an API hiccup (a fault we injected) costs one sample, not the run
                self.errors += 1
            self._stop.wait(self.every)

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None


def double_provisioned(samples: list[Sample]) -> tuple[int, list[dict]]:
    """(samples in which some job held two live TPUs, the first few such moments)."""
    bad = [(s, d) for s in samples if (d := s.doubles())]
    return len(bad), [{"t": s.t, "jobs": d} for s, d in bad[:5]]


def orphan_seconds(samples: list[Sample], since: float) -> tuple[float, list[str]]:
    """TPU-seconds of nodes that existed after `since` (when no job held a TPU any more),
    integrated sample to sample, and their names. A node whose deletion is under way
    (DELETING) is not counted: the ledger's `released` means Google accepted the delete.
    Any node still there at the last sample is named, whatever its state."""
    after = [s for s in samples if s.t >= since]
    total, names = 0.0, set()
    for a, b in zip(after, after[1:], strict=False):
        kept = [n for n in a.nodes if n.state != "DELETING"]
        total += len(kept) * (b.t - a.t)
        names |= {n.name for n in kept}
    if after:
        names |= {n.name for n in after[-1].nodes}
    return total, sorted(names)


def alive_after_release(samples: list[Sample], released: dict[str, list[tuple[float, float]]]) -> tuple[float, list[str]]:
    """TPU-seconds of nodes seen live (LIVE_STATES: billed) while the ledger said they were
    released: `released` maps a node name to the intervals [released, provisioned again)."""
    total, names = 0.0, set()
    for a, b in zip(samples, samples[1:], strict=False):
        for n in a.nodes:
            if n.state in LIVE_STATES and any(lo <= a.t < hi for lo, hi in released.get(n.name, ())):
                total += b.t - a.t
                names.add(n.name)
    return total, sorted(names)
