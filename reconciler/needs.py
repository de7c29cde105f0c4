"""How many chips of which family a job takes: said once, here.

Every chip count of admission (quotas, the line, victims, the model test's checks) goes
through `need_of`. Today it is the job's TPU type (the one it holds, else the one its spec
asks for); placement with fallbacks and multislice will make it the placed type times its
slices, here and nowhere else.
"""

from __future__ import annotations

from typing import NamedTuple

from ledger import tpu_types
from ledger.fold import JobState


class Need(NamedTuple):
    family: str
    chips: int


_NEEDS: dict[str, Need | None] = {}


def need_of(job: JobState) -> Need | None:
    """The chips of which family the job holds (or its next attempt asks for), or None when
    its type is unknown."""
    tpu = job.tpu or job.spec.get("tpu") or {}
    accelerator = tpu.get("accelerator", "")
    try:
        return _NEEDS[accelerator]
    except (KeyError, TypeError):
        kind = tpu_types.lookup(str(accelerator))
        need = Need(kind.family, kind.chips) if kind else None
        if isinstance(accelerator, str) and len(_NEEDS) < 4096:
            _NEEDS[accelerator] = need
        return need


def is_spot(job: JobState) -> bool:
    return (job.spec.get("tpu") or {}).get("pricing") in ("spot", "preemptible")
