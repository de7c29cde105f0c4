"""A real `ledger reconcile` process, scraped over HTTP on a free port: /metrics says what its
fold holds and what its passes and TPU API calls did; /readyz turns 503, saying which check
failed, when the ledger is altered or the store removed; the heartbeat says it stopped."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledger.events import NewEvent
from ledger.placement import held
from ledger.replay import load_state
from ledger.store import open_heartbeats
from ledger.store.sqlite import SQLiteStore
from tests.observability.conftest import free_port
from tests.processes import stop
from tests.usage.ledger_by_hand import EVENTS

WAIT_S = 90.0


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def samples(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = get(f"{base}/metrics")
    assert status == 200
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def wait_for(predicate, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def ledger_file(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    store = SQLiteStore(path)
    for stream, type_, when, data in EVENTS:
        store.append(stream, [NewEvent(type_, data, time=when)])
    store.close()
    return path


@pytest.fixture
def reconciler(ledger_file: Path, tmp_path: Path, ledger_cmd: list[str], repo_root: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """`ledger reconcile` over the ledger, against a TPU endpoint nobody serves (its calls fail
    UNAVAILABLE), with metrics on a free port; stopped with SIGTERM."""
    port = free_port()
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "LEDGER_SECRETS_DIR": str(tmp_path / "secrets")}
    dead = free_port()  # a port with nothing listening: the TPU API is unreachable
    log = (tmp_path / "reconcile.log").open("w")
    proc = subprocess.Popen(
        [*ledger_cmd, "--store", f"sqlite:///{ledger_file}", "reconcile", "--tpu-endpoint", f"127.0.0.1:{dead}",
         "--ssh-key", str(tmp_path / "key"), "--log-dir", str(tmp_path / "logs"), "--log-collect-every", "0",
         "--interval", "0.5", "--metrics-address", f"127.0.0.1:{port}"],
        cwd=repo_root, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(base) or proc.poll() is not None, "the metrics listener")
        assert proc.poll() is None, (tmp_path / "reconcile.log").read_text()
        yield base, proc
    finally:
        stop(proc)
        log.close()


def _answers(base: str) -> bool:
    try:
        return get(f"{base}/healthz")[0] == 200
    except OSError:
        return False


def test_a_running_reconciler_is_scraped(reconciler, ledger_file: Path) -> None:
    base, proc = reconciler
    status, body = get(f"{base}/healthz")
    assert status == 200 and json.loads(body)["component"] == "reconcile"
    wait_for(lambda: get(f"{base}/readyz")[0] == 200, "readiness")
    found = wait_for(lambda: (s := samples(base)) and any(k[0] == "tpu_ledger_tpu_api_errors_total" for k in s) and s,
                     "a failed TPU API call counted")
    store = SQLiteStore(ledger_file, create=False)
    jobs = load_state(store).jobs
    store.close()
    by_state: dict[str, int] = {}
    for job in jobs.values():
        by_state[job.state] = by_state.get(job.state, 0) + 1
    exported = {dict(k[1])["state"]: v for k, v in found.items() if k[0] == "tpu_ledger_jobs"}
    assert exported == by_state  # the fold the reconciler holds, as `ledger list` counts it
    chips = {(dict(k[1])["owner"], dict(k[1])["family"]): v for k, v in found.items() if k[0] == "tpu_ledger_chips_held"}
    expected: dict[tuple[str, str], int] = {}
    for job in jobs.values():
        if job.tpu and (took := held(job.tpu)) is not None:
            expected[(job.owner, took.family)] = expected.get((job.owner, took.family), 0) + took.chips
    assert chips == expected and expected
    assert found[("tpu_ledger_build_info", (("component", "reconcile"), ("version", "0.1.0")))] == 1
    assert found[("tpu_ledger_reconcile_pass_duration_seconds_count", ())] >= 1
    assert found[("tpu_ledger_reconcile_last_success_timestamp_seconds", ())] > 0
    errors = {dict(k[1])["method"]: dict(k[1])["code"] for k, v in found.items() if k[0] == "tpu_ledger_tpu_api_errors_total"}
    assert errors.get("ListNodes") in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    assert found[("tpu_ledger_ledger_sound", ())] == 1
    assert found[("tpu_ledger_lease_holder", (("holder", _holder(found)),))] == 1
    assert ("tpu_ledger_jobs_waiting", ()) in found and ("tpu_ledger_oldest_wait_seconds", ()) in found

    # A new event is counted by type; a preemption followed by a re-create is timed.
    store = SQLiteStore(ledger_file)
    store.append("_system", [NewEvent("note", {"text": "counted"})])
    store.close()
    wait_for(lambda: samples(base).get(("tpu_ledger_events_appended_total", (("type", "note"),)), 0) >= 1,
             "the note counted")


def _holder(found) -> str:
    return next(dict(k[1])["holder"] for k in found if k[0] == "tpu_ledger_lease_holder")


def test_readyz_fails_when_the_ledger_is_altered(reconciler, ledger_file: Path) -> None:
    base, _ = reconciler
    wait_for(lambda: get(f"{base}/readyz")[0] == 200, "readiness")
    store = SQLiteStore(ledger_file)
    store.append("_system", [NewEvent("note", {"text": "to be altered"})])
    head = store.head()
    store.close()
    # Someone who can write the file drops the guard and rewrites the newest event.
    db = sqlite3.connect(ledger_file)
    db.execute("DROP TRIGGER events_no_update")
    db.execute("UPDATE events SET data = ? WHERE seq = ?", ('{"text":"altered"}', head))
    db.commit()
    db.close()
    status, body = get(f"{base}/readyz")
    answer = json.loads(body)
    assert status == 503 and answer["failed"] == ["ledger"], answer
    assert "hash mismatch" in answer["checks"]["ledger"]["detail"]
    assert samples(base)[("tpu_ledger_ledger_sound", ())] == 0


def test_readyz_fails_when_the_store_is_gone_and_the_heartbeat_says_stopped(reconciler, ledger_file: Path) -> None:
    base, proc = reconciler
    wait_for(lambda: get(f"{base}/readyz")[0] == 200, "readiness")
    beats = open_heartbeats(f"sqlite:///{ledger_file}", create=False)
    try:
        (row,) = beats.all()
    finally:
        beats.close()
    assert (row.component, row.pid, row.lease_held, row.stopped) == ("reconcile", proc.pid, True, None)
    moved = ledger_file.with_suffix(".moved")
    ledger_file.rename(moved)
    status, body = get(f"{base}/readyz")
    answer = json.loads(body)
    assert status == 503 and "store" in answer["failed"], answer
    moved.rename(ledger_file)
    wait_for(lambda: get(f"{base}/readyz")[0] == 200, "readiness again")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    beats = open_heartbeats(f"sqlite:///{ledger_file}", create=False)
    try:
        (row,) = beats.all()
    finally:
        beats.close()
    assert row.stopped is not None


def test_a_bad_metrics_address_is_one_line(ledger_file: Path, tmp_path: Path, ledger_cmd: list[str], repo_root: Path) -> None:
    out = subprocess.run([*ledger_cmd, "--store", f"sqlite:///{ledger_file}", "fanout", "--metrics-address", "nonsense"],
                         cwd=repo_root, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "XDG_DATA_HOME": str(tmp_path)})
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "Error: Invalid value for '--metrics-address': 'nonsense' is not HOST:PORT" in out.stderr


