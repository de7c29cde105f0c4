"""Applies one scheduled fault: to a process (kill -9) or, through the emulator's HTTP
control API (emulator/control.py), to the cloud.

A fault on a node chooses among the nodes that are READY at that moment (the schedule's
`pick` draw makes the choice reproducible for a given state); when there is none, the fault
is recorded as skipped. A capacity drop is undone `lasts` seconds later, and `restore()`
undoes whatever is still in force when the fault window closes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from emulator.control import ControlClient, ControlError
from ledger.app.chaos.procs import Supervisor
from ledger.app.chaos.sampler import Sampler
from ledger.app.chaos.scenario import Fault

FAMILY = "v4"


@dataclass
class Applied:
    fault: Fault
    t: float            # time.time() when it was applied
    ok: bool
    detail: str

    def to_dict(self) -> dict:
        return {**self.fault.to_dict(), "t": round(self.t, 3), "ok": self.ok, "detail": self.detail}


@dataclass
class Injector:
    control: ControlClient
    supervisor: Supervisor
    sampler: Sampler
    zone: str
    applied: list[Applied] = field(default_factory=list)
    _restores: list[threading.Timer] = field(default_factory=list)

    def apply(self, fault: Fault) -> Applied:
        try:
            ok, detail = getattr(self, f"_{fault.kind}")(fault)
        except (ControlError, OSError) as exc:  # e.g. the node went away between list and act
            ok, detail = False, f"refused: {exc}"
        done = Applied(fault, time.time(), ok, detail)
        self.applied.append(done)
        return done

    def _ready_node(self, fault: Fault) -> str | None:
        ready = sorted(n.name for n in self.sampler.take().nodes if n.state == "READY")
        return ready[int(fault.pick * len(ready))] if ready else None

    def _kill_reconciler(self, fault: Fault) -> tuple[bool, str]:
        name = f"reconciler-{fault.target}"
        return self.supervisor.kill(name), name

    def _kill_watcher(self, fault: Fault) -> tuple[bool, str]:
        return self.supervisor.kill("watcher"), "watcher"

    def _preempt(self, fault: Fault) -> tuple[bool, str]:
        node = self._ready_node(fault)
        if node is None:
            return False, "skipped: no READY node"
        self.control.preempt(node)
        return True, node

    def _kill_host(self, fault: Fault) -> tuple[bool, str]:
        node = self._ready_node(fault)
        if node is None:
            return False, "skipped: no READY node"
        self.control.kill_host(node, 0)
        return True, f"{node} worker 0"

    def _capacity_drop(self, fault: Fault) -> tuple[bool, str]:
        self.control.set_capacity(self.zone, FAMILY, 0)
        timer = threading.Timer(fault.lasts, self._restore_capacity)
        timer.daemon = True
        timer.start()
        self._restores.append(timer)
        return True, f"{self.zone} {FAMILY} capacity 0 for {fault.lasts:.1f} s"

    def _restore_capacity(self) -> None:
        self.control.set_capacity(self.zone, FAMILY, None)

    def _fail_operation(self, fault: Fault) -> tuple[bool, str]:
        self.control.fail_next_operation("INTERNAL", "chaos: the next operation fails")
        return True, "next operation fails (INTERNAL)"

    def _fail_creation(self, fault: Fault) -> tuple[bool, str]:
        self.control.fail_creations(1, zone=self.zone, code="INTERNAL")
        return True, "next creation fails (INTERNAL)"

    def restore(self) -> None:
        """The window is over: every capacity drop ends now (a later timer finds nothing to do)."""
        for timer in self._restores:
            timer.cancel()
        self._restore_capacity()

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for a in self.applied:
            c = out.setdefault(a.fault.kind, {"applied": 0, "skipped": 0})
            c["applied" if a.ok else "skipped"] += 1
        return out
