"""The TPU devices and libtpu's lockfile: who holds them, and whether that one may be killed.

Killable: a process of an earlier attempt of the job about to start, or of a job the ledger
knows has ended. Never a live job's process, nor one the ledger cannot place.
"""

from __future__ import annotations

import fnmatch

from reconciler.doctor import probe
from reconciler.doctor.model import Check, Context, Facts, Finding, Fix, Paths
from reconciler.doctor.owners import kill, owner

FIXABLE = ("earlier", "ended")


# Who holds the devices or the lock: every process's open files (/proc/N/fd), one link read
# each. perl (perl-base is Essential on Debian/Ubuntu, so on every TPU VM image) reads the
# links without the lstat find adds per fd and without find's per-predicate work: ~4 ms of
# CPU less per host of a ~16 ms probe (bench/doctor_bench.py). find is the fallback; both
# match the link against the same shell globs (fnmatch, `*` crossing `/`, as -lname does).
_PERL = r"""opendir(P, "/proc") or exit; $re = qr/^\Q$ARGV[0]\E\/(?:$ARGV[1])/s;
for $p (grep /^[0-9]+$/, readdir P) { opendir(F, "/proc/$p/fd") or next;
  for (readdir F) { $l = readlink("/proc/$p/fd/$_"); print "/proc/$p/fd\t$l\n" if defined $l && $l =~ $re } }"""


def _probe(paths: Paths, ctx: Context) -> str:
    return scan(paths, perl=True)


def scan(paths: Paths, *, perl: bool) -> str:
    """The probe fragment: device files, holders (perl when the host has it, else find; `perl`
    False: find only, the bench's baseline), and the lockfile."""
    devs = " ".join(probe.rooted(d) for d in paths.devices)
    globs = (*paths.devices, paths.lockfile)
    pats = " -o ".join(f"-lname {probe.rooted(p, real=True, pattern=True)}" for p in globs)
    find = f"$S find /proc/[0-9]*/fd -maxdepth 1 \\( {pats} \\) -printf '%h\\t%l\\n'"
    regex = "|".join(fnmatch.translate(p) for p in globs)  # (?s:dev/accel.*)\Z: perl reads it alike
    lister = f"if command -v perl >/dev/null; then exec $S perl -e {probe.q(_PERL)} \"$RR\" {probe.q(regex)}; else exec {find}; fi" if perl else f"exec {find}"
    return "\n".join([
        f"for f in {devs}; do [ -e \"$f\" ] && printf 'dev\\t%s\\n' \"$f\"; done",
        f"while IFS=$'\\t' read -r d l; do p=${{d#/proc/}}; p=${{p%/fd}}; printf 'holder\\t%s\\t%s\\n' \"$p\" \"$l\"; P+=\" $p\"; "
        f"done < <({lister})",
        f"[ -e {probe.rooted(paths.lockfile)} ] && printf 'lock\\t%s\\n' \"$RR\"/{probe.q(paths.lockfile)}",
    ])


def _is_lock(path: str, paths: Paths) -> bool:
    return path.endswith("/" + paths.lockfile)


def _devices(facts: Facts, ctx: Context, paths: Paths) -> list[Finding]:
    w = facts.worker
    out: list[Finding] = []
    for pid, held in sorted(facts.holders.items()):
        devs = [h for h in held if not _is_lock(h, paths)]
        if not devs:
            continue
        what = f"holding {', '.join(sorted(devs))}"
        p = facts.procs.get(pid)
        if p is None:
            continue  # gone between the listing and its description
        o = owner(p, w, ctx)
        if o.verdict == "current":
            out.append(Finding("devices", w, "ok", f"pid {pid} ({o.label}) {what}"))
        elif o.verdict in FIXABLE:
            out.append(Finding("devices", w, "fix", f"pid {pid} ({o.label}) {what}", kill(p, o.label, what)))
        else:
            out.append(Finding("devices", w, "fail", f"pid {pid} ({o.label}) {what}; not killed"))
    if not out:
        if facts.devices:
            out.append(Finding("devices", w, "ok", f"{len(facts.devices)} device(s) free"))
        else:
            out.append(Finding("devices", w, "warn", "no TPU device files found"))
    return out


def _lock(facts: Facts, ctx: Context, paths: Paths) -> list[Finding]:
    w = facts.worker
    if facts.lockfile is None:
        return [Finding("libtpu_lock", w, "ok", "no lockfile")]
    holders = [pid for pid, held in facts.holders.items() if any(_is_lock(h, paths) for h in held)]
    verdicts = {pid: owner(facts.procs[pid], w, ctx) for pid in holders if pid in facts.procs}
    stuck = [f"pid {pid} ({o.label})" for pid, o in sorted(verdicts.items()) if o.verdict not in (*FIXABLE, "current")]
    if stuck:
        return [Finding("libtpu_lock", w, "fail", f"{facts.lockfile} held by {', '.join(stuck)}")]
    if any(o.verdict == "current" for o in verdicts.values()):
        return [Finding("libtpu_lock", w, "ok", f"{facts.lockfile} held by this job's running attempt")]
    how = f"held by {', '.join(f'pid {p}' for p in sorted(verdicts))}, killed first" if verdicts else "no process holds it"
    return [Finding("libtpu_lock", w, "fix", f"stale lockfile {facts.lockfile} ({how})",
                    Fix("rm_lock", f"removed stale lockfile {facts.lockfile}", path=facts.lockfile))]


DEVICES = Check("devices", _probe, _devices)
LOCK = Check("libtpu_lock", lambda paths, ctx: "", _lock)  # the devices probe lists its holders too
