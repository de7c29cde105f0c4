"""A real emulator, a real SQLite ledger and a reconciler running in a thread."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from emulator import Emulator
from ledger.app.wiring import Settings, build
from ledger.events import NewEvent, actor
from ledger.fold import JobState, replay
from ledger.store import open_store

ZONE = "us-central2-b"


def job_spec(cmd: str, *, accelerator: str = "v4-8", pricing: str = "spot", workers="all", **sections) -> dict:
    spec = {
        "job": {"name": "t", "env_type": "none", "loop": False},
        "tpu": {"allocation_mode": "tpu-vm", "accelerator": accelerator, "zone": ZONE, "pricing": pricing},
        "setup": {"modules": ["command"]},
        "command": {"cmd": cmd, "workers": workers, "env": {}},
        "recovery": {"max_restarts": 3},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


@dataclass
class Harness:
    emu: Emulator
    store_url: str
    tmp: Path
    reconcilers: list = field(default_factory=list)
    threads: list = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def settings(self, holder: str = "test-reconciler") -> Settings:
        return Settings(
            store_url=self.store_url, tpu_endpoint=self.emu.endpoint, ssh_key=self.tmp / "ssh" / "id_ecdsa",
            log_dir=self.tmp / "logs", holder=holder, interval=0.3, orphan_grace_s=1.0, queued_retry_s=0.5,
        )

    def submit(self, job_id: str, spec: dict, *, commit: str = "c0ffee") -> None:
        from ledger.spec.model import spec_hash

        store = open_store(self.store_url)
        commit = hashlib.sha1(f"{job_id}{commit}".encode()).hexdigest()
        store.append(job_id, [NewEvent("submitted", {"spec": spec, "spec_hash": spec_hash(spec), "commit": commit,
                                                      "path": f"jobs/{job_id}.yaml"}, actor("git", "tester"))])
        store.close()

    def append(self, job_id: str, type_: str, data: dict) -> None:
        store = open_store(self.store_url)
        store.append(job_id, [NewEvent(type_, data, actor("cli", "tester"))])
        store.close()

    def start(self, holder: str = "test-reconciler", **overrides):
        rec = build(self.settings(holder), **overrides)
        thread = threading.Thread(target=rec.run, kwargs={"stop": self.stop}, daemon=True)
        thread.start()
        self.reconcilers.append(rec)
        self.threads.append(thread)
        return rec

    def job(self, job_id: str) -> JobState:
        store = open_store(self.store_url)
        try:
            return replay(store.read_stream(job_id)).jobs[job_id]
        finally:
            store.close()

    def types(self, job_id: str) -> list[str]:
        store = open_store(self.store_url)
        try:
            return [e.type for e in store.read_stream(job_id) if e.type not in ("action_intent", "action_outcome")]
        finally:
            store.close()

    def wait(self, job_id: str, predicate: Callable[[JobState], bool], timeout: float = 60) -> JobState:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if predicate(job):
                return job
            time.sleep(0.1)
        raise AssertionError(f"{job_id} never got there; state {self.job(job_id).state}, events {self.types(job_id)}")

    def verify(self) -> None:
        """The ledger's chain, versions, schema and transitions are sound."""
        from ledger.verify import verify_store

        store = open_store(self.store_url)
        try:
            report = verify_store(store)
        finally:
            store.close()
        assert report.ok, report.problem

    def output(self, job_id: str, attempt: int, worker: int = 0) -> str:
        from reconciler.remote import layout

        path = layout.output_log(self.tmp / "logs", job_id, attempt, worker)
        return path.read_text() if path.exists() else ""

    def nodes(self) -> list:
        client = self.emu.client()
        try:
            return list(client.list_nodes(parent=f"projects/tpu-ledger-local/locations/{ZONE}"))
        finally:
            client.transport.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        for rec in self.reconcilers:
            rec.close()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with Emulator(state_dir=tmp_path / "emulator") as emu:
        h = Harness(emu, f"sqlite:///{tmp_path / 'ledger.db'}", tmp_path)
        try:
            yield h
        finally:
            h.close()
