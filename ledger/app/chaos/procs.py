"""The real services as child processes: started, killed with SIGKILL, started again.

Each role (`watcher`, `reconciler-0`, ...) has one argv; a kill leaves no chance to clean up,
exactly as an OOM kill or a power cut would, and the restart comes at once with the same
identity (`--id`), the way systemd's `Restart=always` would bring it back. Output of every
incarnation goes to one log file per role.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Role:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    starts: int = 0
    kills: int = 0
    crashes: list[int] = field(default_factory=list)  # exit codes of exits nobody asked for


class Supervisor:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.roles: dict[str, Role] = {}
        self.env = {**os.environ, **(env or {})}

    def add(self, name: str, argv: list[str], log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.roles[name] = Role(name, argv, log)

    def start(self, name: str) -> None:
        role = self.roles[name]
        with role.log.open("ab") as out:
            out.write(f"\n=== start {role.starts + 1} at {time.time():.3f}\n".encode())
            out.flush()
            role.proc = subprocess.Popen(role.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        role.starts += 1

    def start_all(self) -> None:
        for name in self.roles:
            self.start(name)

    def kill(self, name: str) -> bool:
        """SIGKILL the role's process and start it again; False if it was not running."""
        role = self.roles[name]
        alive = role.proc is not None and role.proc.poll() is None
        if alive:
            assert role.proc is not None
            role.proc.kill()
            role.proc.wait()
            role.kills += 1
        self.start(name)
        return alive

    def revive(self) -> None:
        """Restart any role that exited by itself (a crash is noted, and counted in the report)."""
        for role in self.roles.values():
            if role.proc is not None and role.proc.poll() is not None:
                role.crashes.append(role.proc.returncode)
                self.start(role.name)

    def stop_all(self, timeout: float = 30.0) -> None:
        """SIGTERM everyone (a clean shutdown), then SIGKILL whoever is still there."""
        procs = [r.proc for r in self.roles.values() if r.proc is not None and r.proc.poll() is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def counts(self) -> dict[str, dict[str, object]]:
        return {r.name: {"starts": r.starts, "kills": r.kills, "crashes": list(r.crashes)} for r in self.roles.values()}
