"""A crash loop: `ledger reconcile` as a real process, kill -9'd every few seconds and started
again at once under the same id. Shared by tests/reconciler/test_crashloop.py (what happens)
and bench/crashloop_bench.py (how fast: intent -> outcome times)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ledger.events import parse_time
from ledger.fold import RUNNING
from ledger.store import open_store
from tests.reconciler.conftest import Harness, job_spec

ROOT = Path(__file__).resolve().parents[2]


def reconcile_command(store_url: str, endpoint: str, ssh_key: Path, log_dir: Path, holder: str,
                      interval: float = 0.3) -> list[str]:
    return [sys.executable, "-m", "ledger", "--store", store_url, "reconcile", "--interval", str(interval),
            "--tpu-endpoint", endpoint, "--ssh-key", str(ssh_key), "--log-dir", str(log_dir), "--id", holder,
            "--orphan-grace", "5"]


@dataclass
class CrashLoop:
    """Start the command, SIGKILL it `period` seconds later, start it again, until stopped."""

    command: list[str]
    period: float = 3.0  # may be changed while it runs: the next kill follows the new period
    log: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    root: Path = ROOT  # the source tree the processes run (the bench compares two)
    kills: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _proc: subprocess.Popen | None = None
    _thread: threading.Thread | None = None

    def __enter__(self) -> CrashLoop:
        self._thread = threading.Thread(target=self._run, name="crashloop", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.period + 30)

    def _run(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(self.root), **self.env}
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 - closed below
        try:
            while not self._stop.is_set():
                if self.log:
                    out.write(f"-- {time.strftime('%H:%M:%S')} start (kills so far {self.kills})\n".encode())
                    out.flush()
                self._proc = subprocess.Popen(self.command, cwd=self.root, env=env, stdout=out, stderr=subprocess.STDOUT)
                started = time.monotonic()
                while not self._stop.is_set() and time.monotonic() - started < self.period \
                        and self._proc.poll() is None:  # one that died by itself restarts at once
                    self._stop.wait(0.05)
                if self._proc.poll() is None:
                    self._proc.send_signal(signal.SIGKILL)
                    self.kills += 1
                self._proc.wait()
        finally:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            if self.log:
                out.close()


def intent_outcome_times(store_url: str, action: str) -> list[tuple[str, float | None]]:
    """(job, seconds from each `action` intent to its outcome), None while it has none."""
    store = open_store(store_url)
    try:
        events = list(store.read_all())
    finally:
        store.close()
    intents: dict[str, tuple[str, float]] = {}
    outcomes: dict[str, float] = {}
    for e in events:
        if e.type == "action_intent" and e.data.get("action") == action:
            intents[e.data["action_id"]] = (e.stream, parse_time(e.time).timestamp())
        elif e.type == "action_outcome" and e.data["action_id"] not in outcomes:
            outcomes[e.data["action_id"]] = parse_time(e.time).timestamp()
    return [(job, outcomes[aid] - t if aid in outcomes else None) for aid, (job, t) in intents.items()]


def run_crash_loop(harness: Harness, jobs: dict[str, str], *, period: float = 3.0, crash_at: str = "",
                   root: Path = ROOT) -> CrashLoop:
    """Jobs wait for a `go` file: they are brought to running under a slow loop, then end all
    at once under the fast one, so their releases happen while processes die every `period`.
    With `crash_at="release:intent"`, whichever process records a release intent kills
    itself right after it (LEDGER_FAULT_CRASH), so every release is carried on by a later one."""
    go = harness.tmp / "go"
    for job_id, tail in jobs.items():
        harness.submit(job_id, job_spec(f"while [ ! -e {go} ]; do sleep 0.1; done; {tail}",
                                        recovery={"on_failure": "pass", "max_restarts": 0}))
    s = harness.settings("crashloop")
    loop = CrashLoop(reconcile_command(harness.store_url, s.tpu_endpoint, s.ssh_key, s.log_dir, "crashloop"),
                     period=8.0, log=harness.tmp / "crashloop.log", env={"LEDGER_FAULT_CRASH": crash_at}, root=root)
    with loop:
        for job_id in jobs:
            harness.wait(job_id, lambda j: j.state == RUNNING, timeout=240)
        loop.period = period
        go.touch()
        for job_id in jobs:
            harness.wait(job_id, lambda j: j.terminal and j.tpu is None, timeout=240)
        # Give the loop a few more kills with nothing left to do: nothing must move.
        time.sleep(2 * period)
    return loop
