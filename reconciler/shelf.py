"""The reconciler's settled jobs, held small (ledger.shelf), with what it still asks of them.

The reconciler reads a settled job (reconciler.live) again only rarely: when an event comes
for it (a rerun), when an action or a lease names it, when the orphan collector asks who
released a node lately or whose label a node carries, and when it saves a snapshot. Held as
objects, those jobs were most of its memory (~4 KB each: 940 MB at 119k jobs) and most of
what the cyclic collector walked. Each is shelved as its snapshot piece (`job_text`), which
a snapshot takes as it is; what the orphan collector asks is kept beside it, plain.
"""

from __future__ import annotations

from collections.abc import Iterator

from ledger.fold import JobState
from ledger.shelf import PackedJobs
from ledger.snapshots.jobs import InChunk, job_from_text
from reconciler import naming


class Shelf(PackedJobs):
    """Settled jobs by id (ledger.shelf.PackedJobs, their snapshot pieces, and how many end
    in each state), their labels' owners and the TPUs they released lately."""

    PUT_READS = ("id", "state", "released", "commit", "submitted_seq")  # naming.job_label reads the last two

    def __init__(self) -> None:
        super().__init__()
        self._owners: dict[str, str] = {}  # job label hash (naming.job_hash) -> job id
        self._released: dict[str, str] = {}  # TPU name -> when a shelved job last released it

    def put(self, job: JobState, where: InChunk | None = None) -> None:
        """Shelve `job`; `where`: its piece in a snapshot (PackedJobs.put)."""
        super().put(job, where)
        self._owners[naming.job_label(job)] = job.id
        for name, when in job.released:
            if when > self._released.get(name, ""):
                self._released[name] = when

    def take(self, job_id: str) -> JobState | None:
        """The job, decoded and off the shelf (an event came for it)."""
        job = super().take(job_id)
        if job is not None:
            self._owners.pop(naming.job_label(job), None)
        return job

    def released_since(self, cutoff: str) -> list[str]:
        """The TPUs a shelved job released after `cutoff` (an ISO time)."""
        return [name for name, when in self._released.items() if when > cutoff]

    def forget_releases(self, cutoff: str) -> None:
        """Releases at or before `cutoff` will not be asked about again (the orphan
        collector's cutoff only moves forward): forgotten, so the shelf keeps few."""
        for name in [n for n, when in self._released.items() if when <= cutoff]:
            del self._released[name]

    def job_of_label(self, label: str) -> str | None:
        """The shelved job whose label hash (naming.LABEL_JOB_HASH) is `label`."""
        return self._owners.get(label)

    def frozen(self) -> FrozenShelf:
        """What is shelved now, for another thread (the snapshot saver): later puts and
        takes do not change it."""
        return FrozenShelf(self.copy())


class FrozenShelf:
    def __init__(self, packed: PackedJobs) -> None:
        self._packed = packed

    def pieces(self) -> Iterator[tuple[JobState, bytes]]:
        """Every job and its piece, in id order, decoded one at a time (a snapshot's walk:
        `encode_state(state, settled=...)`)."""
        for _, text in self._packed.texts():
            yield job_from_text(text), text
