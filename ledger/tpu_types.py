"""Cloud TPU accelerator types: chips, hosts and the zones that offer each family.

One table for the spec validator, the emulator and the reconciler. Host counts follow
Google Cloud: v2/v3/v4/v5p name TensorCores (2 per chip, 4 chips per host); v5e
(`v5litepod`) and v6e name chips, one host up to 8 chips, 4 chips per host beyond.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import NamedTuple

_SIZES: dict[str, tuple[int, ...]] = {
    "v2": (8, 32, 128, 256, 512),
    "v3": (8, 32, 64, 128, 256, 512, 1024, 2048),
    "v4": (8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 4096),
    "v5p": (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 6144, 8192, 12288),
    "v5litepod": (1, 4, 8, 16, 32, 64, 128, 256),
    "v6e": (1, 4, 8, 16, 32, 64, 128, 256),
}

# Zones offering each family (public Cloud TPU regions and zones page); an unknown
# combination is a warning, not an error: Google adds zones faster than we release.
ZONES: dict[str, tuple[str, ...]] = {
    "v2": ("us-central1-b", "us-central1-c", "us-central1-f", "europe-west4-a", "asia-east1-c"),
    "v3": ("us-central1-a", "us-central1-b", "europe-west4-a"),
    "v4": ("us-central2-b",),
    "v5p": ("us-east5-a", "us-central1-a", "europe-west4-b"),
    "v5litepod": ("us-central1-a", "us-west1-c", "us-west4-a", "us-east1-c", "us-east5-b", "europe-west4-b", "asia-southeast1-b"),
    "v6e": ("us-east1-d", "us-east5-b", "us-central2-b", "europe-west4-a", "asia-northeast1-b", "us-south1-a"),
}

DEFAULT_RUNTIME: dict[str, str] = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5p": "v2-alpha-tpuv5",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v6e": "v2-alpha-tpuv6e",
}

RUNTIME_VERSIONS: tuple[str, ...] = (
    "tpu-ubuntu2204-base",
    "tpu-vm-base",
    "tpu-vm-tf-2.16.1-pjrt",
    "tpu-vm-pt-2.0",
    "tpu-vm-v4-base",
    "v2-alpha-tpuv5",
    "v2-alpha-tpuv5-lite",
    "v2-alpha-tpuv6e",
)

# The families each runtime version runs on (Google's "TPU software versions" page): a
# version of another generation is refused, as the API refuses it.
RUNTIME_FAMILIES: dict[str, tuple[str, ...]] = {
    "tpu-ubuntu2204-base": ("v2", "v3", "v4"),
    "tpu-vm-base": ("v2", "v3", "v4"),
    "tpu-vm-tf-2.16.1-pjrt": ("v2", "v3", "v4"),
    "tpu-vm-pt-2.0": ("v2", "v3", "v4"),
    "tpu-vm-v4-base": ("v4",),
    "v2-alpha-tpuv5": ("v5p",),
    "v2-alpha-tpuv5-lite": ("v5litepod",),
    "v2-alpha-tpuv6e": ("v6e",),
}


def runtime_fits(version: str, family: str) -> bool:
    return family in RUNTIME_FAMILIES.get(version, ())


def runtime_versions(zone: str) -> list[str]:
    """The runtime versions a zone offers: those of the families it has."""
    return [v for v, families in RUNTIME_FAMILIES.items() if any(zone_offers(zone, f) for f in families)]


FAMILIES: tuple[str, ...] = tuple(_SIZES)
# What people call a family where Google's type names differ (v5e slices are `v5litepod-N`).
FAMILY_ALIASES: dict[str, str] = {"v5e": "v5litepod", "v5lite": "v5litepod"}


def family_named(name: str) -> str | None:
    """The family `name` means (`v4`, `v5e` -> `v5litepod`), or None when there is none."""
    name = FAMILY_ALIASES.get(name, name)
    return name if name in _SIZES else None


_NAME = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)$")


@dataclass(frozen=True, slots=True)
class AcceleratorType:
    name: str
    family: str
    size: int
    chips: int
    hosts: int

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts


def _counts(family: str, size: int) -> tuple[int, int]:
    if family in ("v5litepod", "v6e"):
        chips = size
        return chips, 1 if chips <= 8 else chips // 4
    chips = size // 2
    return chips, max(1, chips // 4)


def lookup(name: str) -> AcceleratorType | None:
    """The accelerator type called `name` (e.g. 'v4-32'), or None if Google offers no such type."""
    m = _NAME.match(name or "")
    if not m:
        return None
    family, size = m.group(1), int(m.group(2))
    if size not in _SIZES[family]:
        return None
    chips, hosts = _counts(family, size)
    return AcceleratorType(name, family, size, chips, hosts)


class Chips(NamedTuple):
    """How many chips of which family: what admission counts against a quota."""

    family: str
    chips: int


@dataclass(frozen=True, slots=True)
class Footprint:
    """What a placement takes (`slices` slices of `accelerator`): `chips` and `hosts` of every
    slice together, and as `need` the (family, chips) a quota counts."""

    accelerator: str
    family: str
    slices: int
    chips: int
    hosts: int
    need: Chips

    @property
    def chips_per_slice(self) -> int:
        return self.chips // self.slices

    @property
    def hosts_per_slice(self) -> int:
        return self.hosts // self.slices


def footprint(accelerator: str, slices: int = 1) -> Footprint | None:
    """`slices` slices of `accelerator` (e.g. 'v4-32'), or None when the type is unknown (or
    not a name at all: a value read from a hand-written event). The one cache of the types:
    the usage fold asks for every interval of a ledger, admission for every waiting job of
    every pass, and each answer is the same object, made once per (type, slices)."""
    try:
        return _footprint(accelerator, slices)
    except TypeError:  # an unhashable value
        return None


@functools.lru_cache(maxsize=4096)
def _footprint(accelerator: str, slices: int) -> Footprint | None:
    kind = lookup(accelerator) if isinstance(accelerator, str) else None
    if kind is None:
        return None
    n = slices if type(slices) is int and slices >= 1 else 1
    return Footprint(kind.name, kind.family, n, kind.chips * n, kind.hosts * n, Chips(kind.family, kind.chips * n))


def all_types() -> list[AcceleratorType]:
    return [t for f, sizes in _SIZES.items() for s in sizes if (t := lookup(f"{f}-{s}"))]


def zone_offers(zone: str, family: str) -> bool:
    return zone in ZONES.get(family, ())


def all_zones() -> list[str]:
    return sorted({z for zones in ZONES.values() for z in zones})


def topology(accel: AcceleratorType) -> str:
    """The chips' arrangement as Google names it (`acceleratorConfig.topology`): 3-D for
    v4 and v5p ("2x2x1" for v4-8), 2-D for the others ("2x2" for v5litepod-4). Dimensions
    double, smallest first; a size that is three times a power of two triples the smallest."""
    three = len(_SIZES_3D.intersection({accel.family}))
    dims = [2, 2, 1] if three else [1, 1]
    chips = accel.chips
    factor = 3 if chips % 3 == 0 else 1
    target = chips // factor
    while _product(dims) < target:
        i = min(range(len(dims)), key=lambda k: (dims[k], -k))
        dims[i] *= 2
    dims = sorted(dims)
    dims[0] *= factor
    dims = sorted(d for d in dims if d > 1) + [d for d in dims if d == 1]  # "2x2x1", as Google writes it
    return "x".join(str(d) for d in dims)


_SIZES_3D = frozenset({"v4", "v5p"})


def _product(dims: list[int]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


# The Cloud TPU API's methods -> the IAM permission each needs: what a PERMISSION_DENIED is
# about (the reconciler's one-line summary; the emulator's injected refusals).
PERMISSIONS: dict[str, str] = {
    "CreateNode": "tpu.nodes.create", "DeleteNode": "tpu.nodes.delete", "GetNode": "tpu.nodes.get",
    "ListNodes": "tpu.nodes.list", "StopNode": "tpu.nodes.stop", "StartNode": "tpu.nodes.start",
    "UpdateNode": "tpu.nodes.update", "GetGuestAttributes": "tpu.nodes.get",
    "CreateQueuedResource": "tpu.queuedResources.create", "DeleteQueuedResource": "tpu.queuedResources.delete",
    "GetQueuedResource": "tpu.queuedResources.get", "ListQueuedResources": "tpu.queuedResources.list",
    "GetOperation": "tpu.operations.get",
}
