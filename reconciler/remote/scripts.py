"""Shell scripts sent to the hosts, built from quoted parts only. Pure functions.

Every value that comes from a spec (command, env, paths, image, flags) enters a script as one
`shlex.quote`d word, so only the user's own `command.cmd` is ever interpreted as shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ledger import defaults
from reconciler.remote import layout
from reconciler.remote.types import Placed

q = shlex.quote
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PROBE_MAGIC = b"LEDGER-PROBE"
START_MAGIC = "LEDGER-START"


def bash(script: str) -> str:
    """The exec request for a script: `bash -c '<script>'`, whatever the login shell is."""
    return "bash -c " + q(script)


def env_name(name: str) -> str:
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise ValueError(f"invalid environment variable name {name!r}: use letters, digits and _")
    return name


def container_name(job_id: str, attempt: int, worker: int, slice_: int = 0) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]", "-", job_id).strip("-.") or "job"
    within = f"-s{int(slice_)}" if slice_ else ""
    return f"ledger-{slug[:80]}-a{int(attempt)}{within}-w{int(worker)}"


def user_command(spec: Mapping, attempt: int, extra_args: Sequence[str]) -> str:
    """The user's cmd with `args` overrides and the attempt flag appended as quoted words."""
    cmd = str(spec["command"]["cmd"]).rstrip()
    args = [str(a) for a in extra_args]
    recovery = spec.get("recovery") or {}
    flag = recovery.get("attempt_flag")
    if recovery.get("pass_attempt") and flag:
        args.append(f"{flag}={int(attempt)}")
    return cmd + "".join(" " + q(a) for a in args)


def env_module(spec: Mapping) -> str | None:
    modules = (spec.get("setup") or {}).get("modules") or []
    envs = [m for m in modules if m in ("docker", "conda", "venv")]
    return envs[-1] if envs else None


@dataclass(frozen=True)
class Launch:
    """How the wrapper runs the command: its argv (as shell words) and an optional container."""

    words: str
    container: str | None = None


def launch(spec: Mapping, job_id: str, attempt: int, worker: int, extra_args: Sequence[str], slice_: int = 0) -> Launch:
    cmd = user_command(spec, attempt, extra_args)
    kind = env_module(spec)
    if kind == "docker":
        d = spec.get("docker") or {}
        name = container_name(job_id, attempt, worker, slice_)
        argv = ["docker", "run", "--rm", "--name", name]
        argv += [str(f) for f in d.get("flags") or []]
        for m in d.get("mount_dirs") or []:
            m = str(m)
            argv += ["-v", m if ":" in m else f"{m}:{m}"]
        for e in d.get("env_vars") or []:
            argv += ["-e", str(e)]
        # Values come from the wrapper's environment: no value appears on the command line.
        for n in _passed_env(spec):
            argv += ["-e", n]
        if d.get("workdir"):
            argv += ["-w", str(d["workdir"])]
        argv += [str(d["image"]), "bash", "-c", cmd]
        return Launch(" ".join(q(a) for a in argv), container=name)
    if kind == "conda":
        name = str((spec.get("conda") or {})["name"])
        return Launch(" ".join(q(a) for a in ["conda", "run", "--no-capture-output", "-n", name, "bash", "-c", cmd]))
    if kind == "venv":
        activate = layout.home(f"{venv_rel(spec)}/bin/activate")
        return Launch("bash -c " + q(f". {activate} && exec bash -c {q(cmd)}"))
    return Launch("bash -c " + q(cmd))


def venv_rel(spec: Mapping) -> str:
    return f"{layout.ROOT}/venvs/{layout.escape_segment(str((spec.get('venv') or {})['name']))}"


# What an attempt's command learns of where it runs (docs/placement.md), set on every host.
PLACEMENT_ENV = ("LEDGER_SLICE_ID", "LEDGER_NUM_SLICES", "LEDGER_ACCELERATOR", "LEDGER_ZONE", "LEDGER_PRICING",
                 "LEDGER_CHIPS", "LEDGER_PLACEMENT")
MEGASCALE_ENV = ("MEGASCALE_PORT", "MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID")


def _passed_env(spec: Mapping) -> list[str]:
    names = ["LEDGER_JOB_ID", "LEDGER_ATTEMPT", "LEDGER_WORKER_ID", *PLACEMENT_ENV, *MEGASCALE_ENV]
    return names + [env_name(k) for k in ((spec.get("command") or {}).get("env") or {})]


def placement_exports(placed: Placed, slice_: int) -> list[str]:
    """The ledger's placement variables (always its own), then, for a multislice job, the
    Megascale ones: each set only when the host (or `command.env`, exported before) has not
    set it already, so a value the TPU VM runtime provides wins."""
    lines = [
        f"export LEDGER_SLICE_ID={int(slice_)} LEDGER_NUM_SLICES={int(placed.slices)} LEDGER_CHIPS={int(placed.chips)} "
        f"LEDGER_PLACEMENT={int(placed.index)}",
        f"export LEDGER_ACCELERATOR={q(placed.accelerator)} LEDGER_ZONE={q(placed.zone)} LEDGER_PRICING={q(placed.pricing)}",
    ]
    if placed.slices > 1:
        unless = 'if [ -z "${%s+x}" ]; then export %s=%s; fi'
        lines += [
            unless % ("MEGASCALE_PORT", "MEGASCALE_PORT", str(int(defaults.MEGASCALE_PORT))),
            unless % ("MEGASCALE_NUM_SLICES", "MEGASCALE_NUM_SLICES", str(int(placed.slices))),
            unless % ("MEGASCALE_SLICE_ID", "MEGASCALE_SLICE_ID", str(int(slice_))),
            # with the port in force on this host: its own MEGASCALE_PORT, if it set one
            unless % ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_COORDINATOR_ADDRESS", q(placed.coordinator) + ':"$MEGASCALE_PORT"'),
        ]
    return lines


def start_script(
    spec: Mapping, job_id: str, attempt: int, worker: int, *, extra_args: Sequence[str], resume: bool,
    slice_: int = 0, placed: Placed | None = None,
) -> str:
    """Start the command detached in its own session; idempotent per (job, slice, worker,
    attempt). `placed`: where the attempt runs (the placement and Megascale variables).

    Prints `LEDGER-START started|existing <pid>`. A second start of the same attempt never
    runs the command twice: it reports the pid of the first.
    """
    base = layout.home(layout.worker_rel(job_id, worker, slice_))
    att = layout.home(layout.attempt_rel(job_id, worker, attempt, slice_))
    env = (spec.get("command") or {}).get("env") or {}
    exports = [
        f"export LEDGER_JOB_ID={q(job_id)} LEDGER_ATTEMPT={int(attempt)} LEDGER_WORKER_ID={int(worker)}",
        f"export LEDGER_WORKDIR={base}/work LEDGER_ATTEMPT_DIR={att}",
    ] + [f"export {env_name(k)}={q(str(v))}" for k, v in env.items()]
    if placed is not None:
        exports += placement_exports(placed, slice_)
    run = launch(spec, job_id, attempt, worker, extra_args, slice_)
    wrapper = "\n".join(
        [
            # A handler (not an ignore) for TERM: children get the default action back, and
            # the wrapper outlives them long enough to record their exit code.
            "trap 'true' TERM HUP INT",
            # fd 9 holds the attempt's `alive` lock (see below): the wrapper keeps it until it
            # exits, the command never sees it.
            f"{run.words} </dev/null 9>&-",
            "rc=$?",
            'printf "%s\\n" "$rc" > "$LEDGER_ATTEMPT_DIR/exit_code.tmp"',
            'mv -f "$LEDGER_ATTEMPT_DIR/exit_code.tmp" "$LEDGER_ATTEMPT_DIR/exit_code"',
        ]
    )
    lines = [
        "set -eu",
        f"mkdir -p {base}/attempts",
        f"if ! mkdir {att} 2>/dev/null; then",
        # Another start got here first: wait for its pid rather than starting again.
        f"  for _ in $(seq 1 100); do [ -s {att}/pid ] && break; sleep 0.1; done",
        f'  echo "{START_MAGIC} existing $(cat {att}/pid 2>/dev/null || echo 0)"; exit 0',
        "fi",
    ]
    if not resume:
        lines.append(f"rm -rf {base}/work")
    lines += [f"mkdir -p {base}/work", f"cd {base}/work", *exports]
    if run.container:
        lines.append(f"printf '%s\\n' {q(run.container)} > {att}/container")
    lines += [
        # An exclusive lock on `alive`, taken before the wrapper exists and inherited by it:
        # held from now until the wrapper has recorded the exit code and exited (or was
        # killed), so a watcher blocked on it (watch_script) wakes the moment the attempt
        # ends, with no polling. Hosts without flock(1) run as before, unwatched.
        f"if command -v flock >/dev/null 2>&1; then exec 9>{att}/alive; flock -n 9; fi",
        # Not a process-group leader (no job control), so setsid needs no fork: $! is the
        # wrapper, the leader of its own session and process group.
        f"setsid bash -c {q(wrapper)} ledger-job </dev/null >>{att}/output.log 2>&1 &",
        "pid=$!",
        # The child makes itself the group's leader after the fork: until then `kill -- -$pid`
        # finds no group, and a stop sent right after this start would miss the job. The pid is
        # told once the group exists (or the wrapper is gone already), within 5 s.
        'for _ in $(seq 1 500); do s=$(cat "/proc/$pid/stat" 2>/dev/null || true); [ -z "$s" ] && break; '
        'f=(${s##*) }); [ "${f[2]:-}" = "$pid" ] && break; sleep 0.01; done',
        "exec 9>&-",
        f'printf "%s\\n" "$pid" > {att}/pid.tmp && mv -f {att}/pid.tmp {att}/pid',
        f'echo "{START_MAGIC} started $pid"',
    ]
    return "\n".join(lines)


def parse_start(stdout: bytes) -> int:
    for line in stdout.decode(errors="replace").splitlines():
        if line.startswith(START_MAGIC):
            return int(line.split()[2])
    raise ValueError(f"no start marker in output: {stdout[-200:]!r}")


def probe_script(job_id: str, worker: int, attempt: int, offset: int, max_bytes: int, slice_: int = 0) -> str:
    """Print `LEDGER-PROBE <state> <code|-> <offset>` then up to `max_bytes` of output from
    `offset`. Builtins only, plus one `dd` (and one `flock` for a running attempt): a probe of
    many hosts costs two or three processes each.

    The state is read before the output: once `exit_code` exists, all output is in the file.
    """
    att = layout.home(layout.attempt_rel(job_id, worker, attempt, slice_))
    return "\n".join(
        [
            f"a={att}",
            'if [ ! -d "$a" ]; then echo "LEDGER-PROBE absent - 0"; exit 0; fi',
            'code=""; pid=""',
            '[ -f "$a/exit_code" ] && read -r code < "$a/exit_code"',
            '[ -s "$a/pid" ] && read -r pid < "$a/pid"',
            'if [ -n "$code" ]; then st="exited $code"',
            'elif [ -z "$pid" ]; then st="starting -"',
            # a process group whose leader is dead but not reaped yet still answers kill -0:
            # the wrapper's `alive` lock (start_script) is released the moment it dies
            'elif kill -0 -- "-$pid" 2>/dev/null && ! { [ -f "$a/alive" ] && flock -n -s "$a/alive" true 2>/dev/null; }; then st="running -"',
            'elif [ -f "$a/exit_code" ] && read -r code < "$a/exit_code"; then st="exited $code"',
            'else st="gone -"; fi',
            f'echo "LEDGER-PROBE $st {int(offset)}"',
            f'[ -f "$a/output.log" ] && exec dd if="$a/output.log" bs=65536 skip={int(offset)} count={int(max_bytes)} iflag=skip_bytes,count_bytes status=none',
            "exit 0",
        ]
    )


WATCH_MAGIC = b"LEDGER-WATCH"


def watch_script(job_id: str, worker: int, attempt: int, offset: int, slice_: int = 0) -> str:
    """A long-lived watcher of one host's attempt, for one channel kept open.

    stdout: the attempt's output from byte `offset` on, as it is written (tail -F).
    stderr: control lines only (the job's output never reaches them): `LEDGER-WATCH
    watching`, then `LEDGER-WATCH ended` once the attempt's wrapper has exited, which the
    watcher learns by blocking on the `alive` lock that the wrapper holds (start_script):
    the kernel wakes it, nothing polls. The watcher ends too when its channel's stdin ends
    (the reconciler let go of it), so re-arming never leaves processes behind.
    `LEDGER-WATCH legacy` (and exit): an attempt started without that lock, or a host
    without flock(1); such hosts are probed every pass instead.
    """
    att = layout.home(layout.attempt_rel(job_id, worker, attempt, slice_))
    return "\n".join(
        [
            f"a={att}",
            'if [ ! -f "$a/alive" ] || ! command -v flock >/dev/null 2>&1; then echo "LEDGER-WATCH legacy" >&2; exit 0; fi',
            'if [ -f "$a/exit_code" ]; then echo "LEDGER-WATCH ended" >&2; exit 0; fi',
            "exec 3<&0",
            f'tail -c +{int(offset) + 1} -F -- "$a/output.log" 2>/dev/null &',
            "t=$!",
            'flock -s "$a/alive" true &',
            "f=$!",
            # the reconciler closed the channel (its stdin ends): stop waiting, nothing stays behind
            '{ cat <&3 >/dev/null 2>&1; kill "$f" 2>/dev/null; } &',
            "c=$!",
            'echo "LEDGER-WATCH watching" >&2',
            # `wait PID`, not `wait -n`: bash's `wait -n` never returns for a child that exited
            # before it was called (the attempt ended just as this watcher started), and the
            # end went unheard until the next probe.
            'if wait "$f"; then echo "LEDGER-WATCH ended" >&2; fi',
            'kill "$t" "$c" 2>/dev/null',
            "exit 0",
        ]
    )


@dataclass(frozen=True)
class ProbeAnswer:
    state: str  # absent | starting | running | exited | gone
    exit_code: int | None
    size: int
    data: bytes


def parse_probe(stdout: bytes) -> ProbeAnswer:
    head, _, data = stdout.partition(b"\n")
    parts = head.split()
    if len(parts) != 4 or parts[0] != PROBE_MAGIC:
        raise ValueError(f"unexpected probe answer: {head[:200]!r}")
    code = None if parts[2] == b"-" else int(parts[2])
    return ProbeAnswer(parts[1].decode(), code, int(parts[3]), data)


def stop_script(job_id: str, worker: int, attempt: int, grace: float, slice_: int = 0) -> str:
    """SIGTERM to the process group, SIGKILL after `grace`; record 137 if nothing else did."""
    att = layout.home(layout.attempt_rel(job_id, worker, attempt, slice_))
    ticks = max(1, int(grace * 10))
    return "\n".join(
        [
            f"a={att}",
            'if [ ! -s "$a/pid" ]; then echo "LEDGER-STOP none"; exit 0; fi',
            'pid=$(cat "$a/pid")',
            'kill -TERM -- "-$pid" 2>/dev/null || true',
            f'for _ in $(seq 1 {ticks}); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done',
            'if kill -0 -- "-$pid" 2>/dev/null; then kill -KILL -- "-$pid" 2>/dev/null || true; fi',
            # Until the group is reaped it still answers kill -0; wait briefly for that.
            'for _ in $(seq 1 50); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done',
            'if [ -s "$a/container" ]; then docker kill "$(cat "$a/container")" >/dev/null 2>&1 || true; fi',
            'if [ ! -f "$a/exit_code" ]; then echo 137 > "$a/exit_code.tmp" && mv -f "$a/exit_code.tmp" "$a/exit_code"; fi',
            'echo "LEDGER-STOP done $(cat "$a/exit_code")"',
        ]
    )
