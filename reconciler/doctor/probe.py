"""The one probe script a host runs for every check (one SSH round trip), and its parser.

Each check contributes a fragment printing tab-separated lines tagged with what they are;
the common part sets `$R` (the VM's root, e.g. `"$HOME"/.vm` in the emulator), `$RR` (its
real path, as /proc/*/fd links show it) and, at the end, describes every process a fragment
named in `$P` with shell builtins only (no process per pid). Pure: strings in, data out.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from reconciler.doctor.model import Check, Context, Facts, Paths, Proc
from reconciler.remote.layout import user_path

q = shlex.quote
# Root looks as is; a user with passwordless sudo (a TPU VM's SSH user) looks through it, to
# see other users' processes (a docker container's are root's). A builtin test for root.
SUDO = '''S=""; [ "$EUID" != 0 ] && sudo -n true 2>/dev/null && S="sudo -n"'''


def glob(path: str) -> str:
    """A shell word that globs: `~/` becomes "$HOME"/; Paths checked the rest is glob-safe."""
    return '"$HOME"/' + path[2:] if path.startswith("~/") else path


def rooted(rel: str, *, real: bool = False, pattern: bool = False) -> str:
    """`rel` under the VM's root: `"$R"/rel` (globbing), or `"$RR/rel"` as one word (`pattern`:
    the glob characters kept literal, for find -lname)."""
    var = "$RR" if real else "$R"
    if pattern:
        return f'"{var}"/{q(rel)}'
    return f'"{var}"/{rel}'


_DESCRIBE = r"""
declare -A seen
for p in $P; do
  [ -n "${seen[$p]}" ] && continue; seen[$p]=1
  [ -r /proc/$p/stat ] || continue; s=$(< /proc/$p/stat)
  s=${s##*) }; set -- $s
  e=""; c=""
  if [ -r /proc/$p/environ ]; then exec 4< /proc/$p/environ; else exec 4< <($S cat /proc/$p/environ); fi
  while IFS= read -r -d '' -u 4 kv; do
    case $kv in LEDGER_JOB_ID=*|LEDGER_ATTEMPT=*|LEDGER_WORKER_ID=*) e+="$kv ";; esac
  done; exec 4<&-
  while IFS= read -r -d '' a; do c+="${a//[$'\t\n']/ } "; [ ${#c} -gt 200 ] && break; done < /proc/$p/cmdline 2>/dev/null
  printf 'proc\t%s\t%s\t%s\t%s\t%s\t%s\n' "$p" "$3" "$4" "${20}" "$e" "${c:0:200}"
done
"""


def script(checks: Iterable[Check], paths: Paths, ctx: Context) -> str:
    root = user_path(paths.root) if paths.root else "''"
    head = [
        "exec 2>/dev/null",  # processes come and go while we look: their errors mean nothing
        SUDO,
        f"R={root}",
        'RR=$R; cd -P "$R/" && RR=${PWD%/}; cd "$HOME"',  # builtins only: no subshell
        "printf 'root\\t%s\\t%s\\n' \"$RR\" \"$HOME\"",
        'P=""',
    ]
    body = [c.probe(paths, ctx) for c in checks]
    return "\n".join([*head, *body, _DESCRIBE])


def parse(worker: int, out: str) -> Facts:
    """The host's answer; paths under the VM's root are shown as the VM sees them (/dev/accel0)."""
    facts = Facts(worker)
    root = home = ""
    for line in out.splitlines():
        tag, _, rest = line.partition("\t")
        if tag == "root":
            root, _, home = rest.partition("\t")
            continue
        if root and tag in ("dev", "holder", "lock", "df"):
            rest = rest.replace(root + "/", "/")
        if home and tag == "df" and rest.endswith("\t" + home):
            rest = rest[: -len(home)] + "~"
        f = rest.split("\t")
        try:
            _take(facts, tag, f)
        except (ValueError, IndexError):
            continue  # a line cut short by a process that went away mid-probe
    return facts


def _take(facts: Facts, tag: str, f: list[str]) -> None:
    if tag == "dev":
        facts.devices.append(f[0])
    elif tag == "holder":
        facts.holders.setdefault(int(f[0]), []).append(f[1])
    elif tag == "lock":
        facts.lockfile = f[0]
    elif tag == "mine":
        facts.mine.add(int(f[0]))
    elif tag == "proc":
        env = dict(kv.split("=", 1) for kv in f[4].split() if "=" in kv)
        facts.procs[int(f[0])] = Proc(
            pid=int(f[0]), pgid=int(f[1]), sid=int(f[2]), start_ticks=int(f[3]),
            job=env.get("LEDGER_JOB_ID", ""), attempt=_int(env.get("LEDGER_ATTEMPT")),
            worker=_int(env.get("LEDGER_WORKER_ID")), cmd=(f[5] if len(f) > 5 else "").strip(),
        )
    elif tag == "mount":
        facts.mounts.append((f[0], f[1], f[2]))
    elif tag == "want":
        facts.wanted.append((f[0], f[1]))
    elif tag == "df":
        facts.disk.append((f[1], int(f[0]) * 1024))
    elif tag == "py":
        facts.python = f[0].removeprefix("Python ").strip()
    elif tag == "pkg":
        name, _, version = f[0].removesuffix(".dist-info").partition("-")
        facts.packages[name.lower().replace("_", "-")] = version


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
