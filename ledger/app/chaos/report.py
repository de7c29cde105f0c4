"""The invariants of a chaos run, as figures, and which of them broke.

Read from the ledger's events (what the services recorded), the cloud samples (what really
existed) and `ledger verify` (run as a user runs it). Broken invariants: a job with two live
TPUs at one sample, TPU-seconds of nodes left after every job let go, a ledger verify calls
unsound, a job still not terminal when the settle time ran out, or a job never submitted.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from ledger.fold import FINISHED, TERMINAL, replay

ACTION_EVENTS = ("action_intent", "action_outcome")


@dataclass
class Report:
    scenario: dict[str, Any]
    plan: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, dict[str, int]] = field(default_factory=dict)
    processes: dict[str, dict[str, Any]] = field(default_factory=dict)
    samples: int = 0
    sample_errors: int = 0
    double_provisioned_samples: int = 0
    double_provisioned_examples: list[dict] = field(default_factory=list)
    orphan_tpu_seconds: float = 0.0
    orphan_nodes: list[str] = field(default_factory=list)
    alive_after_release_s: float = 0.0  # a figure: running TPU-seconds the ledger had called released
    alive_after_release_nodes: list[str] = field(default_factory=list)
    jobs: dict[str, Any] = field(default_factory=dict)
    failures_by_kind: dict[str, int] = field(default_factory=dict)
    events_by_type: dict[str, int] = field(default_factory=dict)
    events: int = 0
    verify: dict[str, Any] = field(default_factory=dict)
    last_fault_to_settled_s: float | None = None
    release_s: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def broken(self) -> list[str]:
        out = []
        if self.double_provisioned_samples:
            out.append(f"double provisioning: {self.double_provisioned_samples} sample(s) with a job holding two live TPUs")
        if self.orphan_tpu_seconds > 0 or self.orphan_nodes:
            out.append(f"orphans: {self.orphan_tpu_seconds:.1f} TPU-seconds after settling ({', '.join(self.orphan_nodes)})")
        if not self.verify.get("ok"):
            out.append(f"verify: {self.verify.get('problem') or 'unsound'}")
        if self.jobs.get("stuck"):
            out.append(f"stuck: {', '.join(f'{j} ({s})' for j, s in self.jobs['stuck'].items())}")
        if self.jobs.get("missing"):
            out.append(f"never submitted: {', '.join(self.jobs['missing'])}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "broken": self.broken(), "ok": not self.broken()}


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def job_figures(events: list[Any], expected: list[str]) -> dict[str, Any]:
    """finished / failed by rule / cancelled / rejected / stuck (with state), missing."""
    state = replay(events)
    finals: dict[str, str] = {}
    for e in events:
        if e.type == "failed" and e.data.get("final"):
            finals[e.stream] = f"{e.data.get('kind')}/{e.data.get('rule', '?')}"
    jobs = {j: state.jobs[j] for j in expected if j in state.jobs}
    return {
        "total": len(expected),
        "finished": sum(1 for j in jobs.values() if j.state == FINISHED),
        "failed_by_rule": dict(Counter(finals[j] for j, s in jobs.items() if s.state == "failed_final" and j in finals)),
        "other_terminal": dict(Counter(s.state for s in jobs.values() if s.state in TERMINAL and s.state not in (FINISHED, "failed_final"))),
        "stuck": {j: s.state + (" holding a TPU" if s.tpu else "") for j, s in jobs.items()
                  if s.state not in TERMINAL or s.tpu is not None},
        "missing": [j for j in expected if j not in state.jobs],
        "attempts": {j: s.attempt for j, s in sorted(jobs.items())},
    }


def settled(events: list[Any], expected: list[str]) -> bool:
    """Every expected job is terminal and holds no TPU."""
    jobs = replay(events).jobs
    return all(j in jobs and jobs[j].state in TERMINAL and jobs[j].tpu is None for j in expected)


def _lets_go(e: Any) -> bool:
    """An intent whose action deletes the job's TPU: release, cancel, or a recovery that reapplies."""
    action, params = e.data.get("action"), e.data.get("params") or {}
    return action in ("release", "cancel") or (action == "recover" and bool(params.get("reapply")))


def release_times(events: list[Any], since: float = 0.0, until: float = float("inf")) -> dict[str, Any]:
    """Seconds from each intent that lets a TPU go (recorded between since and until) to its outcome."""
    intents = {e.data.get("action_id"): _ts(e.time) for e in events
               if e.type == "action_intent" and _lets_go(e) and since <= _ts(e.time) < until}
    outcomes = {e.data.get("action_id"): _ts(e.time) for e in events if e.type == "action_outcome"}
    spans = sorted(outcomes[a] - t for a, t in intents.items() if a in outcomes)
    return {
        "releases": len(intents),
        "without_outcome": sum(1 for a in intents if a not in outcomes),
        "median": round(statistics.median(spans), 2) if spans else None,
        "max": round(spans[-1], 2) if spans else None,
        "over_10s": sum(1 for s in spans if s > 10.0),
    }


def released_intervals(events: list[Any]) -> dict[str, list[tuple[float, float]]]:
    """Per node name, the times the ledger held it released: from each `released` (orphans
    included) to the next `provisioning` of the same name (an attempt re-created under it)."""
    marks: dict[str, list[tuple[float, str]]] = {}
    for e in events:
        name = ((e.data.get("tpu") or {}) if isinstance(e.data.get("tpu"), dict) else {}).get("name")
        if name and e.type in ("released", "provisioning"):
            marks.setdefault(name, []).append((_ts(e.time), e.type))
    out: dict[str, list[tuple[float, float]]] = {}
    for name, seq in marks.items():
        start = None
        for t, kind in seq:
            if kind == "released" and start is None:
                start = t
            elif kind == "provisioning" and start is not None:
                out.setdefault(name, []).append((start, t))
                start = None
        if start is not None:
            out.setdefault(name, []).append((start, float("inf")))
    return out


def event_figures(events: list[Any]) -> tuple[dict[str, int], dict[str, int]]:
    """(events per type, failed attempts per failure kind)."""
    by_type = Counter(e.type for e in events)
    kinds = Counter(str(e.data.get("kind")) for e in events if e.type == "failed")
    return dict(sorted(by_type.items())), dict(sorted(kinds.items()))


def render(r: Report) -> str:
    """The figures as a plain text page (the --json output carries the same)."""
    j = r.jobs
    rel = r.release_s
    lines = [
        f"chaos run: {r.scenario['store']}, {r.scenario['reconcilers']} reconciler(s), {r.scenario['jobs']} jobs, "
        f"{r.scenario['duration']:g} s of faults, seed {r.scenario['seed']}",
        "faults: " + ", ".join(f"{k} {v['applied']}" + (f" (+{v['skipped']} skipped)" if v["skipped"] else "")
                               for k, v in r.faults.items()),
        "processes: " + ", ".join(f"{n} started {p['starts']}x, killed {p['kills']}x"
                                  + (f", exited by itself {len(p['crashes'])}x" if p["crashes"] else "")
                                  for n, p in r.processes.items()),
        f"double-provisioned samples: {r.double_provisioned_samples} of {r.samples}",
        f"orphaned TPU-seconds after settling: {r.orphan_tpu_seconds:.1f}"
        + (f" ({', '.join(r.orphan_nodes)})" if r.orphan_nodes else ""),
        f"TPU-seconds running after the ledger recorded their release: {r.alive_after_release_s:.1f}"
        + (f" ({', '.join(r.alive_after_release_nodes)})" if r.alive_after_release_nodes else ""),
        f"jobs: {j.get('finished', 0)}/{j.get('total', 0)} finished; failed by rule: {j.get('failed_by_rule') or 'none'}; "
        f"stuck: {len(j.get('stuck') or {})}" + (f" {j['stuck']}" if j.get("stuck") else "")
        + (f"; other: {j['other_terminal']}" if j.get("other_terminal") else ""),
        f"failed attempts by kind: {r.failures_by_kind or 'none'}",
        f"events ({r.events}): " + ", ".join(f"{t} {n}" for t, n in r.events_by_type.items()),
        f"verify: {'sound' if r.verify.get('ok') else 'UNSOUND'}" + (f" ({r.verify.get('problem')})" if r.verify.get("problem") else ""),
        "last fault -> every job settled: "
        + (f"{r.last_fault_to_settled_s:.1f} s" if r.last_fault_to_settled_s is not None else "never (settle time ran out)"),
        f"release intent -> outcome during the fault window (release, cancel, reapply): {rel.get('releases', 0)}, median "
        f"{rel.get('median')} s, max {rel.get('max')} s, {rel.get('over_10s', 0)} over 10 s, "
        f"{rel.get('without_outcome', 0)} without outcome",
    ]
    broken = r.broken()
    lines.append("invariants: " + ("all hold" if not broken else "BROKEN: " + "; ".join(broken)))
    return "\n".join(lines)
