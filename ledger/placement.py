"""What a job takes: the family, chips and hosts of a placement (type x slices). Pure.

The one answer for everything that counts chips: admission and quotas, usage and its prices,
fair share, `ledger plan`, the read models. A job **holding** a TPU takes what was placed
(the `tpu` its `provisioning` event recorded: the choice it got, every slice); a job
**waiting** takes the choice it asks for next (choice 0 unless the placement step says which).
An accelerator type the table does not know takes nothing: no number is made up for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledger.fold import JobState
from ledger.spec.placement import placements
from ledger.tpu_types import Footprint, footprint

__all__ = ["Footprint", "accelerator_of", "asked", "chips_of", "family_of", "footprint", "held", "slice_nodes",
           "slices_of", "takes"]


def chips_of(accelerator: str, slices: int = 1) -> int:
    """Chips of `slices` slices of `accelerator` (0 when the type is unknown)."""
    found = footprint(accelerator, slices)
    return found.chips if found is not None else 0


def family_of(accelerator: str) -> str:
    """The accelerator's family ('v4', 'v5litepod', ...), '' when the type is unknown."""
    found = footprint(accelerator)
    return found.family if found is not None else ""


def slices_of(tpu: Mapping[str, Any] | None) -> int:
    """Slices of a TPU as events record it (absent: one)."""
    n = tpu.get("slices", 1) if isinstance(tpu, Mapping) else 1
    return n if type(n) is int and n >= 1 else 1


def held(tpu: Mapping[str, Any] | None) -> Footprint | None:
    """What a TPU, as the ledger records it (`Tpu`: accelerator, slices), takes."""
    if not isinstance(tpu, Mapping):
        return None
    return footprint(str(tpu.get("accelerator") or ""), slices_of(tpu))


def asked(spec: Mapping[str, Any], index: int = 0) -> Footprint | None:
    """What choice `index` of a normalised spec takes (a shared TPU: its one accelerator)."""
    if isinstance(spec, dict):
        choices = placements(spec)
        if 0 <= index < len(choices):
            return choices[index].takes
    tpu = spec.get("tpu") if isinstance(spec, Mapping) else None
    return held(tpu) if isinstance(tpu, Mapping) else None


def takes(job: JobState, index: int | None = None) -> Footprint | None:
    """What the job holds, or else what its next attempt asks for (choice `index`, 0 by default)."""
    if job.tpu is not None:
        return held(job.tpu)
    return asked(job.spec, index or 0)


def accelerator_of(job: JobState) -> str:
    """The accelerator a job holds, or else the one its spec asks for first."""
    held_ = job.tpu.get("accelerator") if isinstance(job.tpu, dict) else None
    asked_ = job.spec.get("tpu") if isinstance(job.spec, dict) else None
    return str(held_ or (asked_.get("accelerator") if isinstance(asked_, dict) else "") or "")


def slice_nodes(tpu: Mapping[str, Any]) -> list[str]:
    """The nodes of a TPU, slice by slice: its `name` for one slice; for a multislice TPU
    (one queued resource `name`, multisliceParams.nodeIdPrefix = `name`) `name-0` .. `name-(N-1)`."""
    name = str(tpu.get("name") or "")
    n = slices_of(tpu)
    return [name] if n == 1 else [f"{name}-{i}" for i in range(n)]
