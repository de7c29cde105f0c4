"""Applies one scheduled fault: to a process (kill -9) or, through the emulator's HTTP
control API (emulator/control.py), to the cloud.

A fault on a node chooses among the nodes that are READY at that moment (the schedule's
`pick` draw makes the choice reproducible for a given state); when there is none, the fault
is recorded as skipped. A capacity drop is undone `lasts` seconds later, and `restore()`
undoes whatever is still in force when the fault window closes.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from emulator.control import ControlClient, ControlError
from ledger.app.chaos.procs import Supervisor
from ledger.app.chaos.sampler import Sampler
from ledger.app.chaos.scenario import Fault
from ledger.app.chaos.world import ledger_cmd
from ledger.fold import BLOCKED, replay
from ledger.store import open_store
from reconciler.tpu import TpuCallError

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
    store_url: str | None = None  # to find the jobs a permission fault blocked
    applied: list[Applied] = field(default_factory=list)
    _restores: list[threading.Timer] = field(default_factory=list)

    def apply(self, fault: Fault) -> Applied:
        try:
            ok, detail = getattr(self, f"_{fault.kind}")(fault)
        except (ControlError, OSError, TpuCallError) as exc:  # the node went away between list and act; the API is down
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
        self._later(fault.lasts, self._restore_capacity)
        return True, f"{self.zone} {FAMILY} capacity 0 for {fault.lasts:.1f} s"

    def _restore_capacity(self) -> None:
        self.control.set_capacity(self.zone, FAMILY, None)

    def _fail_operation(self, fault: Fault) -> tuple[bool, str]:
        self.control.fail_next_operation("INTERNAL", "chaos: the next operation fails")
        return True, "next operation fails (INTERNAL)"

    def _fail_creation(self, fault: Fault) -> tuple[bool, str]:
        self.control.fail_creations(1, zone=self.zone, code="INTERNAL")
        return True, "next creation fails (INTERNAL)"

    def _outage(self, fault: Fault) -> tuple[bool, str]:
        self.control.outage("refuse")
        self._later(fault.lasts, self._end_outage)
        return True, f"TPU API down (every call UNAVAILABLE) for {fault.lasts:.1f} s"

    def _end_outage(self) -> None:
        self.control.outage(None)

    def _permission(self, fault: Fault) -> tuple[bool, str]:
        self.control.fail_calls("CreateNode", "PERMISSION_DENIED", zone=self.zone)
        self._later(fault.lasts, self.resume_blocked)
        return True, f"next create refused PERMISSION_DENIED; blocked jobs resumed {fault.lasts:.1f} s later"

    def resume_blocked(self) -> None:
        """The operator granted the role: `ledger resume` each blocked job, as a person would."""
        if self.store_url is None:
            return
        store = open_store(self.store_url, create=False)
        try:
            blocked = [j.id for j in replay(store.read_all()).jobs.values() if j.state == BLOCKED]
        finally:
            store.close()
        for job_id in blocked:
            subprocess.run(ledger_cmd(self.store_url, "resume", job_id), capture_output=True, check=False)

    def _later(self, seconds: float, fn: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, fn)
        timer.daemon = True
        timer.start()
        self._restores.append(timer)

    def restore(self) -> None:
        """The window is over: every capacity drop and outage ends now, and blocked jobs are
        resumed (a later timer finds nothing to do)."""
        for timer in self._restores:
            timer.cancel()
        self._restore_capacity()
        self._end_outage()
        self.resume_blocked()

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for a in self.applied:
            c = out.setdefault(a.fault.kind, {"applied": 0, "skipped": 0})
            c["applied" if a.ok else "skipped"] += 1
        return out
