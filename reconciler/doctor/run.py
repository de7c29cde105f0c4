"""The doctor: one probe per worker in parallel over SSH, the verdicts, and the safe repairs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from reconciler.doctor import fixes, probe
from reconciler.doctor.devices import DEVICES, LOCK
from reconciler.doctor.leftovers import LEFTOVERS
from reconciler.doctor.model import Check, Context, Facts, Finding, Fix, Paths
from reconciler.doctor.mounts import DISK, MOUNTS
from reconciler.doctor.versions import VERSIONS
from reconciler.remote import scripts
from reconciler.remote.errors import RemoteError

CHECKS: tuple[Check, ...] = (DEVICES, LOCK, LEFTOVERS, MOUNTS, DISK, VERSIONS)
ORDER = {c.name: i for i, c in enumerate(CHECKS)}
R = TypeVar("R")  # what a function run on every host answers


class Shell(Protocol):
    """What the doctor needs of the SSH runner (reconciler.remote.RemoteRunner.run)."""

    def run(self, host: Any, command: str, *, timeout: float | None = None) -> Any: ...


@dataclass
class Report:
    """Every check's findings on every worker."""

    facts: dict[int, Facts] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def fixable(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "fix"]

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "fail"]

    @property
    def health(self) -> str:
        """unhealthy (a check failed) | needs fixing | warning | healthy."""
        statuses = {f.status for f in self.findings}
        if "fail" in statuses:
            return "unhealthy"
        if "fix" in statuses:
            return "needs fixing"
        return "warning" if "warn" in statuses else "healthy"

    def problem(self) -> str:
        """One line for a `failed` event: what cannot be fixed, worker by worker."""
        return "; ".join(f"worker {f.worker}: {f.check}: {f.message}" for f in self.failures)[:2000]

    def to_json(self) -> dict[str, Any]:
        return {"health": self.health, "findings": [f.to_dict() for f in self.findings]}


@dataclass(frozen=True)
class Repair:
    finding: Finding
    ok: bool


class Doctor:
    def __init__(self, shell: Shell, paths: Paths | None = None, *, checks: Sequence[Check] = CHECKS,
                 timeout: float = 30.0, max_parallel: int = 64) -> None:
        self.shell = shell
        self.paths = paths or Paths()
        self.checks = tuple(checks)
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="doctor")

    def _each(self, hosts: Sequence[Any], fn: Callable[[Any], R]) -> dict[int, R]:
        futures = {h.id: self._pool.submit(fn, h) for h in hosts}  # every slice's: by rank
        return {w: f.result() for w, f in futures.items()}

    def examine(self, hosts: Sequence[Any], ctx: Context) -> Report:
        """Probe every host (one round trip each, in parallel) and judge what they answered."""
        text = probe.script(self.checks, self.paths, ctx)

        def one(h: Any) -> Facts:
            try:
                res = self.shell.run(h, scripts.bash(text), timeout=self.timeout)
            except RemoteError as exc:
                return Facts(h.id, error=str(exc))
            return probe.parse(h.id, res.stdout.decode(errors="replace"))

        return judge(self._each(hosts, one), ctx, self.paths, self.checks)

    def repair(self, report: Report, hosts: Sequence[Any]) -> list[Repair]:
        """Apply every safe fix the report found, per worker in one round trip each."""
        by_worker: dict[int, list[Finding]] = {}
        seen: set[tuple[int, Fix]] = set()
        for f in report.fixable:
            assert f.fix is not None
            if (f.worker, f.fix) not in seen:  # a pid found by two checks is killed once
                seen.add((f.worker, f.fix))
                by_worker.setdefault(f.worker, []).append(f)
        chosen = [h for h in hosts if h.id in by_worker]

        def one(h: Any) -> list[Repair]:
            todo = by_worker[h.id]
            script = fixes.script([f.fix for f in todo if f.fix is not None], self.paths)
            try:
                res = self.shell.run(h, scripts.bash(script), timeout=self.timeout + fixes.KILL_GRACE_S)
                done = fixes.parse(res.stdout.decode(errors="replace"), len(todo))
            except RemoteError:
                done = [False] * len(todo)
            return [Repair(f, ok) for f, ok in zip(todo, done, strict=True)]

        return [r for rs in self._each(chosen, one).values() for r in rs]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def judge(facts: Mapping[int, Facts], ctx: Context, paths: Paths, checks: Sequence[Check] = CHECKS) -> Report:
    """The verdicts over what the hosts answered. Pure."""
    report = Report(dict(facts))
    for w, f in sorted(facts.items()):
        if f.error is not None:
            report.findings.append(Finding("ssh", w, "fail", f"cannot probe: {f.error}"))
            continue
        for c in checks:
            report.findings.extend(c.verdict(f, ctx, paths))
    for c in checks:
        if c.across is not None:
            warned = c.across(facts)
            warned_workers = {x.worker for x in warned}
            report.findings = [x for x in report.findings if not (x.check == c.name and x.worker in warned_workers)] + warned
    report.findings.sort(key=lambda x: (x.worker, ORDER.get(x.check, 99)))
    return report
