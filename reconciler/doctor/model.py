"""Plain data of host hygiene: where to look, what a host answered, what the checks found."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ledger import defaults

Status = Literal["ok", "warn", "fix", "fail"]
# A path part the probe passes to the shell unquoted so that it globs: no spaces, no $, no quotes.
_GLOB_SAFE = re.compile(r"[A-Za-z0-9_./*?\[\]-]+")


@dataclass(frozen=True)
class Paths:
    """Where a TPU VM keeps what the checks look at. Each path is relative to `root`: "" on a
    real VM, `~/.vm` in the emulator's sandboxes (so the same probe runs on both)."""

    root: str = defaults.HOST_ROOT
    devices: tuple[str, ...] = ("dev/accel*", "dev/vfio/[0-9]*")
    lockfile: str = "tmp/libtpu_lockfile"
    mounts: str = "proc/mounts"
    tmp: str = "tmp"
    workdir: str = "~"  # the jobs' working directories live under ~/.tpu-ledger
    sites: tuple[str, ...] = (
        "/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
        "/usr/lib/python3/dist-packages", "~/.local/lib/python3*/site-packages",
    )
    min_free: int = defaults.DOCTOR_MIN_FREE_BYTES

    def __post_init__(self) -> None:
        for p in (*self.devices, self.lockfile, self.mounts, self.tmp, *self.sites):
            if not _GLOB_SAFE.fullmatch(p.removeprefix("~/")):
                raise ValueError(f"host path {p!r}: use letters, digits and _ . / * ? [ ] - only")

    @classmethod
    def for_root(cls, root: str, **kw: Any) -> Paths:
        return cls(root=root.rstrip("/"), **kw)


@dataclass(frozen=True)
class Proc:
    """A process the probe described: ids, start time and what the ledger put in its env."""

    pid: int
    pgid: int
    sid: int
    start_ticks: int
    job: str = ""
    attempt: int | None = None
    worker: int | None = None
    cmd: str = ""


@dataclass
class Facts:
    """One host's answer to the probe."""

    worker: int
    devices: list[str] = field(default_factory=list)
    holders: dict[int, list[str]] = field(default_factory=dict)  # pid -> device/lock paths held
    lockfile: str | None = None
    mine: set[int] = field(default_factory=set)  # pids carrying this job's id (or its pgids)
    procs: dict[int, Proc] = field(default_factory=dict)
    mounts: list[tuple[str, str, str]] = field(default_factory=list)  # (source, mount point, type)
    wanted: list[tuple[str, str]] = field(default_factory=list)  # (as written, resolved)
    disk: list[tuple[str, int]] = field(default_factory=list)  # (path, bytes free)
    python: str = ""
    packages: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # the host could not be probed


@dataclass(frozen=True)
class JobInfo:
    """What the ledger knows of a job a process claims to belong to."""

    state: str
    ended: bool
    ended_at: float | None = None  # epoch seconds
    attempt: int = 0


@dataclass(frozen=True)
class Context:
    """What the checks know besides the hosts: the job about to start and the ledger's records."""

    job_id: str | None
    attempt: int
    spec: Mapping[str, Any]
    tpu: str = ""
    shared: bool = False
    # worker -> {pgid started by an earlier attempt of this job: that attempt}
    started: Mapping[int, Mapping[int, int]] = field(default_factory=dict)
    jobs: Mapping[str, JobInfo] = field(default_factory=dict)
    now: float = 0.0


@dataclass(frozen=True)
class Fix:
    """A safe repair: kill pids (checked by start time), remove the lockfile, or remount."""

    kind: Literal["kill", "rm_lock", "remount"]
    done: str  # what the ledger says once it worked: "killed pid 4242 (alice/old-run, ...)"
    pids: tuple[tuple[int, int], ...] = ()  # (pid, start ticks)
    path: str = ""
    bucket: str = ""


@dataclass(frozen=True)
class Finding:
    check: str
    worker: int
    status: Status
    message: str
    fix: Fix | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"check": self.check, "worker": self.worker, "status": self.status, "message": self.message}
        if self.fix is not None:
            out["fix"] = self.fix.done
        return out


@dataclass(frozen=True)
class Check:
    """One check: a name, a probe (a shell fragment from quoted parts), a verdict per host,
    and optionally a verdict across hosts (versions must agree)."""

    name: str
    probe: Callable[[Paths, Context], str]
    verdict: Callable[[Facts, Context, Paths], list[Finding]]
    across: Callable[[Mapping[int, Facts]], list[Finding]] | None = None
