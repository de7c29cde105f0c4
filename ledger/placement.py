"""What a job takes: the family, chips and hosts of a placement (type x slices). Pure.

The one answer for everything that counts chips: admission and quotas, usage and its prices,
fair share, `ledger plan`, the read models. A job **holding** a TPU takes what was placed
(the `tpu` its `provisioning` event recorded: the choice it got, every slice); a job
**waiting** takes the choice it asks for next (choice 0 unless the placement step says which).
An accelerator type the table does not know takes nothing: no number is made up for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ledger import tpu_types
from ledger.fold import JobState
from ledger.spec.placement import choice


@dataclass(frozen=True, slots=True)
class Footprint:
    """What a placement takes: `chips` and `hosts` of every slice together."""

    accelerator: str
    family: str
    slices: int
    chips: int
    hosts: int

    @property
    def chips_per_slice(self) -> int:
        return self.chips // self.slices

    @property
    def hosts_per_slice(self) -> int:
        return self.hosts // self.slices


_FOOTPRINTS: dict[tuple[str, int], Footprint | None] = {}


def footprint(accelerator: str, slices: int = 1) -> Footprint | None:
    """`slices` slices of `accelerator` (e.g. 'v4-32'), or None when the type is unknown.
    Looked up once per (type, slices): the usage fold asks for every interval of a ledger."""
    key = (accelerator, slices)
    try:
        return _FOOTPRINTS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable value read from a hand-written event
        return None
    kind = tpu_types.lookup(accelerator) if isinstance(accelerator, str) else None
    n = slices if type(slices) is int and slices >= 1 else 1
    found = Footprint(kind.name, kind.family, n, kind.chips * n, kind.hosts * n) if kind else None
    if len(_FOOTPRINTS) < 4096:
        _FOOTPRINTS[key] = found
    return found


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
    found = choice(spec, index) if isinstance(spec, dict) else None
    if found is not None:
        return footprint(found.accelerator, found.slices)
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
