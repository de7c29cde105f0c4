"""Settled jobs, held small.

A lab's ledger keeps every job it ever ran. The reconciler reads a settled job (reconciler.live)
again only rarely: when an event comes for it (a rerun), when an action or a lease names it,
when the orphan collector asks who released a node lately or whose label a node carries, and
when it saves a snapshot. Held as objects, those jobs were most of its memory (~4 KB each:
940 MB at 119k jobs) and most of what the cyclic collector walked. The shelf holds each one
as its piece of a snapshot (`ledger.replay.job_text`), LZ4-compressed with the first shelved
job's piece as the dictionary (one lab's jobs repeat each other's fields): ~360 bytes a job,
none of them a container. What the orphan collector asks is kept beside it, plain.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import lz4.block

from ledger.fold import JobState
from ledger.replay import job_from_text, job_text
from reconciler import naming


class Shelf:
    """Settled jobs by id, each decoded only when asked (`get`, `take`, `frozen().pieces()`)."""

    def __init__(self) -> None:
        self._packed: dict[str, bytes] = {}
        self._dict = b""  # the compression dictionary: the first shelved job's piece
        self._owners: dict[str, str] = {}  # job label hash (naming.job_hash) -> job id
        self._released: dict[str, str] = {}  # TPU name -> when a shelved job last released it
        self.states: dict[str, int] = {}  # how many shelved jobs end in each state (metrics)

    def __len__(self) -> int:
        return len(self._packed)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._packed

    def put(self, job: JobState, text: bytes | None = None) -> None:
        """Shelve `job`; `text`: its piece (`job_text`), when the caller has it already."""
        text = text if text is not None else job_text(job)
        if not self._dict:
            self._dict = text
        if job.id in self._packed:
            self.take(job.id)
        self._packed[job.id] = lz4.block.compress(text, dict=self._dict)
        self._count(job.state, 1)
        self._owners[naming.job_label(job)] = job.id
        for name, when in job.released:
            if when > self._released.get(name, ""):
                self._released[name] = when

    def get(self, job_id: str) -> JobState | None:
        """A decoded copy; the job stays shelved."""
        packed = self._packed.get(job_id)
        return None if packed is None else job_from_text(lz4.block.decompress(packed, dict=self._dict))

    def take(self, job_id: str) -> JobState | None:
        """The job, decoded and off the shelf (an event came for it)."""
        job = self.get(job_id)
        if job is not None:
            del self._packed[job_id]
            self._count(job.state, -1)
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
        return FrozenShelf(dict(self._packed), self._dict)

    def _count(self, state: str, by: int) -> None:
        left = self.states.get(state, 0) + by
        if left:
            self.states[state] = left
        else:
            self.states.pop(state, None)


class FrozenShelf:
    def __init__(self, packed: Mapping[str, bytes], dictionary: bytes) -> None:
        self._packed, self._dict = packed, dictionary

    def pieces(self) -> Iterator[tuple[JobState, bytes]]:
        """Every job and its piece, in id order, decoded one at a time (a snapshot's walk:
        `encode_state(state, settled=...)`)."""
        for job_id in sorted(self._packed):
            text = lz4.block.decompress(self._packed[job_id], dict=self._dict)
            yield job_from_text(text), text
