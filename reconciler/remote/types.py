"""Plain data the remote runner takes and returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ledger import defaults

# The CLI resolves --ssh-user / LEDGER_SSH_USER and hands the runner its username.
DEFAULT_USERNAME = defaults.SSH_USER

State = Literal["running", "exited", "gone", "unknown"]


@dataclass(frozen=True)
class Host:
    """One TPU host of a node; everything the runner keeps is keyed by `worker`."""

    worker: int
    address: str
    port: int = 22
    username: str = DEFAULT_USERNAME
    # "<keytype> <base64>" pinned from the TPU API's guest attributes, when known.
    host_key: str | None = None
    # The private key this host accepts, when not the pool's: a TPU the reconciler created
    # holds only its job's own key (reconciler.keys.JobKeys), never the reconciler's.
    key_path: Path | None = None
    # A multislice job's hosts: the slice this one is in (`worker` counts within its slice),
    # and its rank among all of the job's hosts (slice by slice), which keys everything the
    # runner returns. A one-slice job's rank is its worker id (the default, -1).
    slice: int = 0
    rank: int = -1

    @property
    def id(self) -> int:
        """What the runner keys this host by: its rank (= its worker id in one slice)."""
        return self.rank if self.rank >= 0 else self.worker

    @property
    def label(self) -> str:
        return f"slice {self.slice} worker {self.worker}" if self.slice else f"worker {self.worker}"


@dataclass(frozen=True)
class Placed:
    """Where an attempt runs, as its command learns it from the environment (docs/placement.md):
    the choice it landed on and, for a multislice job, the Megascale coordinator (the
    address of worker 0 of slice 0)."""

    accelerator: str = ""
    zone: str = ""
    pricing: str = ""
    chips: int = 0  # every slice's
    index: int = 0  # the choice: 0 is the `tpu` block
    slices: int = 1
    coordinator: str = ""


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class HostStatus:
    """One host's answer to a status probe.

    state: running | exited (exit_code set) | gone (host unreachable, or the attempt's
    process is missing without an exit code) | unknown (the probe could not decide, e.g. the
    host key changed or authentication failed: a person must look).
    matches: output lines, new since the last probe, that match a failure pattern;
    kinds: their kinds (see patterns.classify), index for index.
    """

    state: State
    exit_code: int | None = None
    matches: list[str] = field(default_factory=list)
    error: str | None = None
    kinds: list[str] = field(default_factory=list)
    output_bytes: int = 0  # size of the host's output log seen by this probe
    checkpoint: int | None = None  # step of the newest checkpoint line this attempt printed here


@dataclass
class SetupReport:
    """What setup did on each host: modules skipped (check passed) or run, and failures."""

    failures: list[tuple[int, str, str]] = field(default_factory=list)  # (worker, module, message)
    outcomes: dict[int, dict[str, str]] = field(default_factory=dict)  # worker -> module -> skipped|done|failed|not-run

    @property
    def ok(self) -> bool:
        return not self.failures
