"""Processes of this job's earlier attempts still running on a host: killed before a start.

Found by the job id in their environment (the start script exports it; children inherit it)
and by the process groups the ledger recorded in earlier `started` events.
"""

from __future__ import annotations

from reconciler.doctor import probe
from reconciler.doctor.model import Check, Context, Facts, Finding, Paths
from reconciler.doctor.owners import kill, owner


def _probe(paths: Paths, ctx: Context) -> str:
    if not ctx.job_id or ctx.attempt <= 1 and not ctx.started:
        return ""  # a job's first attempt has no earlier one to leave anything behind
    # A process of the job started from this host: its work directory under this host's home
    # (the start script's LEDGER_WORKDIR). On a TPU VM that is every process of the job; on
    # the emulator, whose hosts share one machine's /proc, it leaves alone another host's
    # process of a job of the same id (another ledger's, or another test's: such a kill was seen).
    lines = [
        f"for f in $($S grep -lzxF -- {probe.q('LEDGER_JOB_ID=' + ctx.job_id)} /proc/[0-9]*/environ); do "
        "$S grep -qzF -- \"LEDGER_WORKDIR=$HOME/\" \"$f\" || continue; "
        "p=${f#/proc/}; p=${p%/environ}; printf 'mine\\t%s\\n' \"$p\"; P+=\" $p\"; done",
    ]
    pgids = sorted({g for per in ctx.started.values() for g in per})
    if pgids:
        lines.append(f"for p in $(pgrep -g {','.join(str(int(g)) for g in pgids)}); do printf 'mine\\t%s\\n' \"$p\"; P+=\" $p\"; done")
    return "\n".join(lines)


def _verdict(facts: Facts, ctx: Context, paths: Paths) -> list[Finding]:
    w = facts.worker
    if not ctx.job_id:
        return [Finding("leftovers", w, "ok", "no job: nothing to look for")]
    out: list[Finding] = []
    for pid in sorted(facts.mine):
        p = facts.procs.get(pid)
        if p is None or p.worker is not None and p.worker != w:
            continue  # gone, or a process of another worker sharing this machine (the emulator)
        o = owner(p, w, ctx)
        if o.verdict == "earlier":
            out.append(Finding("leftovers", w, "fix", f"pid {pid} ({o.label}) still runs: {p.cmd[:80]}",
                               kill(p, o.label, "left running")))
    return out or [Finding("leftovers", w, "ok", "no process of an earlier attempt")]


LEFTOVERS = Check("leftovers", _probe, _verdict)
