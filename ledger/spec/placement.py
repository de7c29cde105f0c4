"""Where a job may run: its `tpu` block and `tpu.fallbacks`, as an ordered list of complete
placements (docs/placement.md). The one place that validates and normalises them, and the one
place every reader asks: `placements(spec)`, `placed_spec(spec, index)`, `failover(spec)`.

A placement ("choice") is complete: allocation mode, accelerator, zone, runtime version,
pricing, reservation and slices, with the hosts and chips of one slice. Choice 0 is the `tpu`
block; choice i is the `tpu` block with `fallbacks[i-1]` laid over it. A choice may also carry
its own `gcsfuse` and `args_flags` (place-dependent settings). Pure: no I/O.

What readers ask is here, with nothing but the accelerator table beneath it (the reconciler
and `ledger tpus` load no spec checker); `placement_check.py` validates the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from ledger import defaults, tpu_types

# The fields a fallback may override (besides its own gcsfuse and args).
FIELDS = ("allocation_mode", "accelerator", "zone", "version", "pricing", "reservation", "slices")
QUEUED = "queued-resources"
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Choice:
    """One complete placement of a job: `index` 0 is the `tpu` block, i the i-th fallback."""

    index: int
    allocation_mode: str
    accelerator: str
    zone: str
    version: str
    pricing: str
    reservation: str | None
    slices: int
    # What the choice takes (its type times its slices; None for an unknown type): made once
    # with the choice, since every pass asks it of every waiting job (admission's chips).
    takes: tpu_types.Footprint | None = field(default=None, compare=False, repr=False)

    @property
    def queued(self) -> bool:
        return self.allocation_mode == QUEUED

    @property
    def key(self) -> tuple[str, str, str]:
        """What the lab-wide capacity memory knows it by: (zone, accelerator, pricing)."""
        return self.zone, self.accelerator, self.pricing

    def label(self) -> str:
        """`2 x v4-32 spot us-central2-b`: how views name it."""
        count = f"{self.slices} x " if self.slices > 1 else ""
        return f"{count}{self.accelerator} {self.pricing} {self.zone}"


def failover(spec: dict) -> dict[str, Any]:
    """The job's failover rules, defaults filled (a spec without `tpu.failover` has them all).
    Cached by the spec object, as `placements` is: do not edit the answer."""
    found = _RULES.get(id(spec))
    if found is not None and found[0] is spec:
        return found[1]
    rules = failover_rules(spec)
    _keep(_RULES, id(spec), (spec, rules))
    return rules


# The most entries each cache of this module holds: full, it starts over, so that no stream
# of distinct specs grows it without bound, and the blocks read lately are the ones it knows.
MOST_CACHED = 65_536


def _keep(cache: dict[K, V], key: K, value: V) -> V:
    """`value` kept under `key`, the cache emptied first when it is full."""
    if len(cache) >= MOST_CACHED:
        cache.clear()
    cache[key] = value
    return value


_RULES: dict[int, tuple[dict, dict[str, Any]]] = {}


def failover_rules(spec: dict) -> dict[str, Any]:
    """`failover` without its cache (the spec checker's, on a block it is still building)."""
    given = ((spec.get("tpu") or {}).get("failover") or {}) if isinstance(spec, dict) else {}
    return {
        "stockouts": int(given.get("stockouts", defaults.FAILOVER_STOCKOUTS)),
        "wait_s": given.get("wait_s"),
        "prefer_first": bool(given.get("prefer_first", False)),
        "resume_across": bool(given.get("resume_across", False)),
    }


_CHOICES: dict[int, tuple[dict, tuple[Choice, ...]]] = {}
_INTERNED: dict[tuple[Choice, ...], tuple[Choice, ...]] = {}
_BY_BLOCK: dict[bytes, tuple[Choice, ...]] = {}  # a `tpu` block's JSON -> its choices
_block_key = msgspec.json.Encoder().encode


def placements(spec: dict) -> tuple[Choice, ...]:
    """Every choice of a normalised spec, in order ((): a shared TPU, or no TPU request).
    Cached by the spec object (a job's spec is replaced, never edited, by the fold), so a
    planner pass over many jobs builds each list once; and by the `tpu` block's text, so a
    reader that has just decoded 10,000 jobs (each spec its own object) builds each list of
    alike jobs once too."""
    found = _CHOICES.get(id(spec))
    if found is not None and found[0] is spec:
        return found[1]
    tpu = spec.get("tpu") if isinstance(spec, dict) else None
    if not isinstance(tpu, dict) or tpu.get("shared") or not tpu.get("accelerator"):
        choices: tuple[Choice, ...] = ()
    else:
        try:
            key: bytes | None = _block_key(tpu)
        except (TypeError, msgspec.EncodeError):  # not JSON (a spec made by hand): built each time
            key = None
        known = _BY_BLOCK.get(key) if key is not None else None
        if known is not None:
            choices = known
        else:
            rows = [tpu, *(f for f in tpu.get("fallbacks") or () if isinstance(f, dict))]
            made = tuple(_choice(i, row, tpu) for i, row in enumerate(rows))
            # One object for equal lists: a planner pass over many alike jobs decides each list once.
            interned = _INTERNED.get(made)
            choices = interned if interned is not None else _keep(_INTERNED, made, made)
            if key is not None:
                _keep(_BY_BLOCK, key, choices)
    _keep(_CHOICES, id(spec), (spec, choices))
    return choices


def _choice(index: int, row: dict, base: dict) -> Choice:
    def get(name: str, default: Any = None) -> Any:
        return row.get(name, base.get(name, default))

    accelerator, slices = str(get("accelerator", "")), int(get("slices", 1) or 1)
    return Choice(index, str(get("allocation_mode", "tpu-vm")), accelerator, str(get("zone", "")),
                  str(get("version", "") or ""), str(get("pricing", "ondemand")), get("reservation"), slices,
                  tpu_types.footprint(accelerator, slices))


def choice(spec: dict, index: int) -> Choice | None:
    """Choice `index` of the spec, or None when it has no such choice."""
    choices = placements(spec)
    return choices[index] if 0 <= index < len(choices) else None


def placed_spec(spec: dict, index: int) -> dict:
    """The spec as the job runs on choice `index`: its `tpu` block is that choice, and the
    choice's own `gcsfuse` and `args_flags` replace the job's. Choice 0 is the spec itself."""
    if index <= 0:
        return spec
    tpu = spec.get("tpu") or {}
    fallbacks = tpu.get("fallbacks") or []
    if index > len(fallbacks):
        return spec
    alt = fallbacks[index - 1]
    out = dict(spec)
    out["tpu"] = {**tpu, **{k: v for k, v in alt.items() if k in (*FIELDS, "hosts", "chips")}}
    if "gcsfuse" in alt:
        out["gcsfuse"] = alt["gcsfuse"]
    if "args_flags" in alt:
        out["command"] = {**(spec.get("command") or {}), "args_flags": list(alt["args_flags"])}
    return out
