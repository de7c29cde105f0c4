"""How many chips of which family a job takes, as admission counts them.

Every chip count of admission (quotas, the line, victims, the model test's checks) goes
through `need_of`: the placed type times its slices for a job holding a TPU, the choice the
placement step picked for a waiting one (ledger.placement, which usage, prices and the
views ask too).
"""

from __future__ import annotations

from ledger.fold import JobState
from ledger.placement import takes
from ledger.spec.placement import Choice
from ledger.tpu_types import Chips as Need


def need_of(job: JobState, choice: Choice | None = None) -> Need | None:
    """The chips of which family the job holds (what was placed: its type times its slices),
    or else those its next attempt asks for (`choice`, one of its placements, as the
    placement step picked it; its first by default); None when its type is unknown. The
    count itself is ledger.placement's, the one every reader asks (made once per type and
    slices, in ledger.tpu_types)."""
    # The choice carries what it takes: no second look-up of the job's placements (every
    # pass asks this of every waiting job).
    found = choice.takes if choice is not None and job.tpu is None else takes(job)
    return found.need if found is not None else None


def is_spot(job: JobState) -> bool:
    return (job.spec.get("tpu") or {}).get("pricing") in ("spot", "preemptible")
