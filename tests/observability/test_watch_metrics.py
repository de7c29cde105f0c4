"""A real `ledger watch` over a real jobs hub: its metrics, its readiness once it has read the
branch, and its heartbeat in `ledger status`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from tests.observability.conftest import free_port
from tests.observability.test_service import get, samples, wait_for


def test_a_running_watcher_is_scraped_and_listed(tmp_path: Path, ledger_cmd: list[str], repo_root: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    store = f"sqlite:///{tmp_path / 'ledger.db'}"
    hub = tmp_path / "jobs.git"
    subprocess.run([*ledger_cmd, "init", "--bare", str(hub)], cwd=repo_root, env=env, check=True, capture_output=True,
                   timeout=120)
    port = free_port()
    proc = subprocess.Popen([*ledger_cmd, "--store", store, "watch", "--repo", str(hub), "--interval", "0.5",
                             "--no-watchdog", "--metrics-address", f"127.0.0.1:{port}"],
                            cwd=repo_root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(base) or proc.poll() is not None, "the watcher to be ready")
        assert proc.poll() is None
        found = samples(base)
        assert found[("tpu_ledger_build_info", (("component", "watch"), ("version", "0.1.0")))] == 1
        assert found[("tpu_ledger_watcher_last_success_timestamp_seconds", ())] > 0
        assert found[("tpu_ledger_watcher_errors_total", ())] == 0
        assert ("tpu_ledger_watcher_lag_seconds", ()) in found
        assert not any(k[0].startswith("tpu_ledger_reconcile") for k in found)  # no reconciler metric in a watcher
        listed = wait_for(lambda: _listed(ledger_cmd, repo_root, env, store), "the watcher's heartbeat")
        assert [(r["component"], r["state"], r["pid"]) for r in listed] == [("watch", "alive", proc.pid)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _ready(base: str) -> bool:
    try:
        return get(f"{base}/readyz")[0] == 200
    except OSError:
        return False


def _listed(ledger_cmd: list[str], repo_root: Path, env: dict, store: str) -> list[dict] | None:
    out = subprocess.run([*ledger_cmd, "--store", store, "status", "--json"], cwd=repo_root, env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    rows = json.loads(out.stdout)
    return rows or None
