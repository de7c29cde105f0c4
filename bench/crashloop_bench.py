"""Progress under a crash loop: release intent -> outcome while `ledger reconcile` (a real
process on a SQLite ledger, against the emulator) is kill -9'd every `--period` seconds and
started again at once under the same id.

Jobs are brought to RUNNING, then all end at once (two finish, one fails under `on_failure:
pass`), so their releases fall at random points of the kill cycle. Two modes:

- kill-loop:     only the periodic SIGKILL;
- crash-at-intent: besides, the process that records a release intent kills itself right
                 after it (LEDGER_FAULT_CRASH=release:intent): every release is carried on
                 by a later process, the worst case.

Times come from the ledger (event `time`, stamped at append): each release intent to its
outcome. Prints the median and the maximum per mode; the target is <= 10 s.

What a fresh process costs before it acts, which bounds progress when processes live ~3 s:

- start-up:     `ledger reconcile --help`, CPU (user+sys) and wall seconds: the imports;
- first action: a fresh `ledger reconcile` on a ledger whose release intent has no outcome
                (the TPU already deleted), from spawn until it has carried the release on
                (LEDGER_FAULT_CRASH=release:effect kills it there, so every run finds the
                same intent): CPU and wall seconds.

`--compare REF` runs every measure also with the code of git commit REF (e.g. `main`),
interleaved in the same run, so the two are compared under the same load.

    python bench/crashloop_bench.py [--rounds 2] [--jobs 3] [--period 3] [--starts 5]
                                    [--compare REF] [--no-loop] [--json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emulator import Emulator  # noqa: E402
from tests.reconciler.conftest import Harness, job_spec  # noqa: E402
from tests.reconciler.crashloop import ROOT, intent_outcome_times, reconcile_command, run_crash_loop  # noqa: E402

MODES = {"kill-loop": "", "crash-at-intent": "release:intent"}
PACKAGES = ("ledger", "reconciler", "emulator")


def source_tree(ref: str, into: Path) -> Path:
    """The product's packages at git commit `ref`, unpacked into `into` (the repository is
    only read: no worktree is added)."""
    archive = subprocess.run(["git", "archive", ref, *PACKAGES], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    found = subprocess.run([sys.executable, "-c", "import ledger; print(ledger.__file__)"], cwd=into,
                           env={**os.environ, "PYTHONPATH": str(into)}, capture_output=True, text=True, check=True)
    assert found.stdout.strip() == str(into / "ledger" / "__init__.py"), found.stdout  # the copy is what runs
    return into


def timed(command: list[str], root: Path, env: dict[str, str], limit: float = 120) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, wait status) of one process run to its end."""
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=root, env={**os.environ, "PYTHONPATH": str(root), **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watchdog = threading.Timer(limit, lambda: os.kill(proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        watchdog.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    return usage.ru_utime + usage.ru_stime, time.monotonic() - started, status


def startup(root: Path) -> tuple[float, float]:
    cpu, wall, _ = timed([sys.executable, "-m", "ledger", "reconcile", "--help"], root, {})
    return cpu, wall


class FirstAction:
    """A ledger with one release intent whose TPU is deleted but whose outcome is missing."""

    def __init__(self, tmp: Path) -> None:
        self.emu = Emulator(state_dir=tmp / "emulator").__enter__()
        self.h = Harness(self.emu, f"sqlite:///{tmp / 'ledger.db'}", tmp)
        self.h.submit("bench/first", job_spec("exit 0", recovery={"on_failure": "pass", "max_restarts": 0}))
        s = self.h.settings("first-action")
        self.command = reconcile_command(self.h.store_url, s.tpu_endpoint, s.ssh_key, s.log_dir, "first-action")
        # This one provisions, runs and starts the release, and dies after deleting the TPU.
        _, _, status = timed(self.command, ROOT, {"LEDGER_FAULT_CRASH": "release:effect"}, limit=300)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"set-up ended with {status}"

    def run(self, root: Path) -> tuple[float, float]:
        cpu, wall, status = timed(self.command, root, {"LEDGER_FAULT_CRASH": "release:effect"}, limit=60)
        return (cpu, wall) if os.WIFSIGNALED(status) else (float("nan"), float("nan"))

    def close(self) -> None:
        self.emu.__exit__(None, None, None)


def one_round(jobs: int, period: float, crash_at: str, root: Path) -> tuple[list[float], int, int]:
    """Release times (s), unresolved releases, kills."""
    with tempfile.TemporaryDirectory() as tmp, Emulator(state_dir=Path(tmp) / "emulator") as emu:
        h = Harness(emu, f"sqlite:///{Path(tmp) / 'ledger.db'}", Path(tmp))
        specs = {f"bench/j{i}": "exit 3" if i % 3 == 2 else "exit 0" for i in range(jobs)}
        loop = run_crash_loop(h, specs, period=period, crash_at=crash_at, root=root)
        times = intent_outcome_times(h.store_url, "release")
        return [t for _, t in times if t is not None], sum(t is None for _, t in times), loop.kills


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v == v]  # a run that never got there is left out (and counted)
    return round(statistics.median(values), 3) if values else None


def measure_starts(trees: dict[str, Path], starts: int) -> dict[str, dict]:
    runs: dict[str, dict[str, list]] = {name: {"help": [], "first": []} for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        scene = FirstAction(Path(tmp))
        try:
            for _ in range(starts):  # interleaved: both trees see the same load
                for name, root in trees.items():
                    runs[name]["help"].append(startup(root))
                    runs[name]["first"].append(scene.run(root))
        finally:
            scene.close()
    out = {}
    for name, r in runs.items():
        out[name] = {
            "runs": starts,
            "help_cpu_s": _median([c for c, _ in r["help"]]), "help_wall_s": _median([w for _, w in r["help"]]),
            "first_action_cpu_s": _median([c for c, _ in r["first"]]),
            "first_action_wall_s": _median([w for _, w in r["first"]]),
            "first_action_missed": sum(c != c for c, _ in r["first"]),
        }
    return out


def measure_loop(trees: dict[str, Path], rounds: int, jobs: int, period: float) -> dict[str, dict]:
    results: dict[str, dict] = {}
    for mode, crash_at in MODES.items():
        acc = {name: ([], 0, 0) for name in trees}
        for _ in range(rounds):
            for name, root in trees.items():
                t, u, k = one_round(jobs, period, crash_at, root)
                times, unresolved, kills = acc[name]
                acc[name] = (times + t, unresolved + u, kills + k)
        for name, (times, unresolved, kills) in acc.items():
            results.setdefault(name, {})[mode] = {
                "releases": len(times), "unresolved": unresolved, "kills": kills, "period_s": period,
                "median_s": round(statistics.median(times), 2) if times else None,
                "max_s": round(max(times), 2) if times else None,
            }
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--period", type=float, default=3.0, help="seconds between kills")
    ap.add_argument("--starts", type=int, default=5, help="fresh processes timed for start-up and first action")
    ap.add_argument("--compare", metavar="REF", help="also measure the code of this git commit, in the same run")
    ap.add_argument("--no-loop", action="store_true", help="only the start-up and first-action measures")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": ROOT}
        if args.compare:
            trees = {args.compare: source_tree(args.compare, Path(tmp)), **trees}
        results = {"load_1min": round(load, 1),
                   "start": measure_starts(trees, args.starts) if args.starts else {},
                   "loop": {} if args.no_loop else measure_loop(trees, args.rounds, args.jobs, args.period)}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"load average at start: {results['load_1min']}")
    for name, r in results["start"].items():
        print(f"{name:>12}: start-up (reconcile --help) cpu {r['help_cpu_s']} s, wall {r['help_wall_s']} s; "
              f"first action cpu {r['first_action_cpu_s']} s, wall {r['first_action_wall_s']} s "
              f"(median of {r['runs']}, {r['first_action_missed']} missed)")
    for name, modes in results["loop"].items():
        for mode, r in modes.items():
            print(f"{name:>12}: {mode:16} release intent -> outcome: median {r['median_s']} s, max {r['max_s']} s "
                  f"({r['releases']} releases, {r['unresolved']} unresolved, {r['kills']} kills every {r['period_s']} s)")


if __name__ == "__main__":
    main()
