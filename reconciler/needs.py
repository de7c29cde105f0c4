"""How many chips of which family a job takes, as admission counts them.

Every chip count of admission (quotas, the line, victims, the model test's checks) goes
through `need_of`: the placed type times its slices for a job holding a TPU, the choice the
placement step picked for a waiting one (ledger.placement, which usage, prices and the
views ask too).
"""

from __future__ import annotations

from typing import NamedTuple

from ledger.fold import JobState
from ledger.placement import Footprint, takes


class Need(NamedTuple):
    family: str
    chips: int


def need_of(job: JobState, choice: int | None = None) -> Need | None:
    """The chips of which family the job holds (what was placed: its type times its slices),
    or else those its next attempt asks for (choice `choice` of its placements, as the
    placement step picked it; the first by default); None when its type is unknown. The
    count itself is ledger.placement's, the one every reader asks."""
    found = takes(job, choice)
    if found is None:
        return None
    need = _NEEDS.get(id(found))  # footprints are made once per (type, slices): so are needs
    if need is None or need[0] is not found:
        need = _NEEDS[id(found)] = (found, Need(found.family, found.chips))
    return need[1]


_NEEDS: dict[int, tuple[Footprint, Need]] = {}


def is_spot(job: JobState) -> bool:
    return (job.spec.get("tpu") or {}).get("pricing") in ("spot", "preemptible")
