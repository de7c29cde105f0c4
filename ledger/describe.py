"""Events in plain words: one line saying what an event means, for people (inspect, the
demo's progress, notifications). Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def figure(value: float, like: float | None = None) -> str:
    """A chip or chip-hour figure for people: a whole number as such, else three significant
    digits but never fewer decimals than `like` (the quota it is read against) has, and never
    rounded onto it, so a small quota never reads as "used 0 of 0.01" nor 99.97 as "100 of
    100": 0.004 of 0.01, 12.3 of 100, 99.97 of 100."""
    if not math.isfinite(value):
        return str(value)
    if value == int(value):
        return str(int(value))
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    if like is not None and math.isfinite(like):
        if like != int(like):
            digits = max(digits, len(repr(float(like)).split(".")[1]))
        while digits < 9 and round(value, digits) == like:  # just under (or over) reads as under
            digits += 1
    text = f"{value:.{min(digits, 9)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _tpu(d: Mapping[str, Any]) -> str:
    """`name 2 x v5litepod-16 spot us-west4-a (queued_resource, choice 1)`: a TPU and where it
    was placed (the slices, pricing and choice are named when the event records them)."""
    tpu = d.get("tpu")
    if not isinstance(tpu, Mapping):
        return ""
    slices = tpu.get("slices") if isinstance(tpu.get("slices"), int) and tpu["slices"] > 1 else None
    parts = [str(tpu["name"])] if tpu.get("name") else []
    if tpu.get("accelerator"):
        parts.append(f"{slices} x {tpu['accelerator']}" if slices else str(tpu["accelerator"]))
    parts += [str(tpu[k]) for k in ("pricing", "zone") if tpu.get(k)]
    notes = [str(tpu["kind"])] if tpu.get("kind") else []
    if isinstance(tpu.get("placement"), int) and tpu["placement"]:
        notes.append(f"choice {tpu['placement']}")
    if notes:
        parts.append(f"({', '.join(notes)})")
    return " ".join(parts)


def _slice(d: Mapping[str, Any]) -> str:
    return f"slice {d['slice']}: " if isinstance(d.get("slice"), int) else ""


def who_asked(d: Mapping[str, Any]) -> str:
    """"asked by Alice, approved by Bob, merged by Sam": the three roles of a job's change
    (a ledger written before `authors`/`merger` were recorded shows what it has)."""
    authors = d.get("authors") or [_person(d.get("author_name"), d.get("author"))]
    parts = [f"asked by {', '.join(authors)}"]
    reviews = d.get("reviews") or []
    if reviews:  # the forge's reviews, each with its CODEOWNERS standing
        parts.append("approved by " + ", ".join(f"@{r['login']}" + (" (code owner)" if r.get("codeowner") else "")
                                                for r in reviews))
    elif d.get("approvers"):
        parts.append(f"approved by {', '.join(d['approvers'])}")
    if d.get("merger"):
        parts.append(f"merged by {d['merger']}")
    if d.get("signed_by"):
        parts.append(f"signed by {d['signed_by']}")
    return ", ".join(parts)


def _person(name: Any, email: Any) -> str:
    if name and email and name != email:
        return f"{name} <{email}>"
    return str(name or email or "?")


def summarize(type_: str, d: Mapping[str, Any]) -> str:
    """One line saying what an event means; unknown shapes fall back to its keys."""
    g = d.get
    match type_:
        case "submitted" | "spec_updated":
            return f"{g('path', '')} @ {str(g('commit', ''))[:10]}: {who_asked(d)}"
        case "rejected":
            return str(g("reason", ""))
        case "policy_applied":
            q = g("blocks", {}).get("quotas", {})
            return f"sharing policy {str(g('digest', ''))[:10]} from {g('source') or '(none)'} by {g('holder', '?')}: " \
                   f"{len(q.get('users', {}))} user, {len(q.get('teams', {}))} team quota(s)" + (", a lab quota" if q.get("lab") else "")
        case "admitted":
            return f"past its quotas by {g('by', '?')}: {g('reason', '')}"
        case "quota_spent":
            used, limit = g("used"), g("limit")
            if not isinstance(used, int | float) or not isinstance(limit, int | float):
                return ", ".join(sorted(d))
            return (f"{g('scope', '?')} used {figure(used, limit)} of its {figure(limit)} {g('family', '')} chip-hours "
                    f"this week: {'stops at its next checkpoint' if g('then') == 'checkpoint-and-stop' else 'runs to its end'}")
        case "queued" | "cancel_requested" | "cancelled":
            return str(g("reason", ""))
        case "provisioning":
            return f"attempt {g('attempt', '?')} {_tpu(d)}".strip()
        case "provisioned":
            hosts = g("hosts") or []
            return f"{_tpu(d)} {len(hosts)} host(s)".strip()
        case "provision_failed":
            return f"{g('reason', '')}{' (final)' if g('final') else ' (blocked: fix it, then `ledger resume`)'}"
        case "api_unreachable":
            api = g("api") or {}
            return f"TPU API of {g('zone', '?')} unreachable: {api.get('code', '?')} {api.get('message', '')}".strip()
        case "api_reachable":
            return f"TPU API of {g('zone', '?')} answers again" + (f" after {g('down_s'):.0f} s" if isinstance(g("down_s"), int | float) else "")
        case "setup_started" | "setup_done":
            return f"attempt {g('attempt', '?')}"
        case "setup_failed":
            return " ".join(str(g(k)) for k in ("module", "worker", "reason") if g(k) is not None)
        case "started":
            health = f" (hosts {g('health')})" if g("health") else ""
            return (f"attempt {g('attempt')}" if "attempt" in d else "") + health
        case "preempted":
            if g("cause") in ("priority", "reclaim"):
                return f"for {g('winner', '?')} ({g('cause')}): {g('reason', '')}"
            if g("cause") == "quota":
                return f"at its checkpoint (quota): {g('reason', '')}"
            return _slice(d) + " ".join(str(x) for x in (g("tpu_state"), g("reason")) if x)
        case "failed":
            code = f" exit {g('exit_code')}" if g("exit_code") is not None else ""
            return f"{_slice(d)}{g('kind', '?')}{code}: {g('message', '')}{' (final)' if g('final') else ''}"
        case "resumed" | "rerun":
            return f"rule {g('rule', type_)}, attempt {g('attempt', '?')}, restarts {g('restarts', '?')}" + (" (reapply)" if g("reapply") else "")
        case "finished":
            if "exit_codes" in d:
                return f"attempt {g('attempt', '?')}, every worker exited 0" if set((g("exit_codes") or {}).values()) == {0} \
                    else f"attempt {g('attempt', '?')}, exit codes {g('exit_codes')}"
            return f"exit {g('exit_code')}" if "exit_code" in d else ""
        case "released":
            return " ".join(x for x in (_tpu(d), str(g("reason", ""))) if x)
        case "action_intent" if g("action") == "clean":
            return _cleaning(d)
        case "action_outcome" if g("action") == "clean" and isinstance(g("result"), Mapping):
            return _cleaned(d)
        case "action_intent":
            why = f": {g('reason')}" if g("reason") else ""
            return f"will {g('action', '?')}{why} (by {g('holder', '?')}, id …{str(g('action_id', ''))[-8:]})"
        case "action_outcome":
            what = g("action") or "action"
            done = "done" if g("ok") else ("interrupted: " if g("interrupted") else "failed: ") + str(g("error", ""))
            return f"{what} {done} (id …{str(g('action_id', ''))[-8:]})"
        case "history_rewritten" | "rewrite_accepted":
            return f"{str(g('old_head', ''))[:10]} -> {str(g('new_head', ''))[:10]}"
        case "quarantined":
            return f"commit {str(g('commit', ''))[:10]} set aside: {g('error', '')}"
        case "note":
            return str(g("text", ""))
        case "checkpointed":
            worker = f" (worker {g('worker')})" if g("worker") is not None else ""
            return f"attempt {g('attempt', '?')}, step {g('step', '?')}{worker}"
        case "policy_changed":
            prices = g("prices") or []
            table = ", ".join(f"{p.get('family')}/{p.get('pricing')} {p.get('usd_per_chip_hour')}" for p in prices
                              if isinstance(p, Mapping))
            return f"policy @ {str(g('commit', ''))[:10]}: " + (f"prices {table}" if table else "no prices")
    return ", ".join(sorted(d))


def actor_text(a: Mapping[str, Any]) -> str:
    return f"{a.get('kind', '?')}:{a.get('name', '?')}"


def _by_worker(items: Any, key: str) -> str:
    """`worker 0: killed pid 4242 (alice/old-run, ended 2 h ago) holding /dev/accel0; ...`"""
    parts = [f"worker {i.get('worker', '?')}: {i.get(key, '')}" for i in items or [] if isinstance(i, Mapping)]
    return "; ".join(parts)


def _cleaning(d: Mapping[str, Any]) -> str:
    """The host checks found what they will repair (reconciler.doctor)."""
    found = _by_worker([f for f in (d.get("params") or {}).get("found") or [] if isinstance(f, Mapping) and f.get("status") == "fix"], "message")
    return f"host checks will repair: {found or 'nothing'}"


def _cleaned(d: Mapping[str, Any]) -> str:
    r = d["result"]
    done = _by_worker(r.get("done"), "what")
    failed = _by_worker(r.get("failed"), "what")
    return "; ".join(x for x in (done, f"could not repair {failed}" if failed else "") if x) or "host checks: nothing repaired"

