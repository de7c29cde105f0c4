"""The safe repairs as one shell script per host, from quoted parts. Pure.

Each repair re-checks what made it safe at the moment it acts: a pid is killed only while
it is still the process that was judged (same start time: pids are reused), the lockfile
is removed only while no process holds it. The script prints `done<TAB>i` or `failed<TAB>i`
for the i-th repair.
"""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.doctor import probe
from reconciler.doctor.model import Fix, Paths
from reconciler.remote import layout

q = probe.q
KILL_GRACE_S = 3

_KILL = r"""
same() { [ -r /proc/$1/stat ] || return 1; local want=$2 s; s=$(< /proc/$1/stat); s=${s##*) }; set -- $s; [ "${20}" = "$want" ]; }
stop() {  # stop PID START...: TERM, then KILL after the grace; true when all are gone
  local i p left
  for ((i = 1; i <= $#; i += 2)); do p=${!i}; j=$((i + 1)); same "$p" "${!j}" && $S kill -TERM "$p"; done
  for ((t = 0; t < GRACE * 10; t++)); do
    left=0; for ((i = 1; i <= $#; i += 2)); do j=$((i + 1)); same "${!i}" "${!j}" && left=1; done
    [ $left = 0 ] && return 0; sleep 0.1
  done
  for ((i = 1; i <= $#; i += 2)); do j=$((i + 1)); same "${!i}" "${!j}" && $S kill -KILL "${!i}"; done
  sleep 0.2
  for ((i = 1; i <= $#; i += 2)); do j=$((i + 1)); same "${!i}" "${!j}" && return 1; done
  return 0
}
"""


def script(fixes: Sequence[Fix], paths: Paths) -> str:
    """Kills first (all at once, so a group dies together), then locks, then mounts."""
    lines = ["exec 2>&1", probe.SUDO, f"GRACE={KILL_GRACE_S}", _KILL]
    kills = [(i, f) for i, f in enumerate(fixes) if f.kind == "kill"]
    if kills:
        args = " ".join(f"{int(pid)} {int(start)}" for _, f in kills for pid, start in f.pids)
        ok = " ".join(str(i) for i, _ in kills)
        lines.append(f"if stop {args}; then r=done; else r=failed; fi; for i in {ok}; do printf '%s\\t%s\\n' \"$r\" \"$i\"; done")
    for i, f in enumerate(fixes):
        if f.kind == "rm_lock":
            lock = probe.rooted(paths.lockfile)
            pat = probe.rooted(paths.lockfile, real=True, pattern=True)
            lines.append('RR=$(cd "$R/" 2>/dev/null && pwd -P); RR=${RR%/}')
            lines.append(f"if [ -n \"$($S find /proc/[0-9]*/fd -maxdepth 1 -lname {pat} -print -quit 2>/dev/null)\" ]; "
                         f"then printf 'failed\\t{i}\\n'; else $S rm -f {lock} && printf 'done\\t{i}\\n' || printf 'failed\\t{i}\\n'; fi")
        elif f.kind == "remount":
            path = layout.user_path(f.path)
            lines.append(f"{{ fusermount -u {path} >/dev/null 2>&1; mkdir -p {path} && "
                         f"gcsfuse --implicit-dirs {q(f.bucket)} {path}; }} && printf 'done\\t{i}\\n' || printf 'failed\\t{i}\\n'")
    root = layout.user_path(paths.root) if paths.root else "''"
    return "\n".join([f"R={root}", *lines])


def parse(out: str, n: int) -> list[bool]:
    done = [False] * n
    for line in out.splitlines():
        tag, _, idx = line.partition("\t")
        if tag == "done" and idx.strip().isdigit() and int(idx) < n:
            done[int(idx)] = True
    return done
