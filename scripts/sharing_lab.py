"""Builds a small lab's ledger under docs/examples/sharing-policy.yaml: past usage, running
jobs and a queue, for trying `ledger queue` and the dashboard's Queue page (the picture in
docs/sharing.md was taken of it).

    python scripts/sharing_lab.py /tmp/lab            # writes /tmp/lab/ledger.db
    ledger --store sqlite:////tmp/lab/ledger.db queue
    ledger --store sqlite:////tmp/lab/ledger.db dashboard --port 8900
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from ledger.app.queueview import record_policy
from ledger.events import NewEvent, actor, format_time
from ledger.spec.policy import load_policy
from ledger.store import open_store

POLICY = Path(__file__).resolve().parent.parent / "docs" / "examples" / "sharing-policy.yaml"
ZONE = "us-central2-b"
NOW = time.time()


def at(hours_ago: float) -> str:
    return format_time(datetime.fromtimestamp(NOW - hours_ago * 3600, UTC))


def spec(accelerator: str, priority: int) -> dict:
    return {"job": {"name": "x"}, "tpu": {"accelerator": accelerator, "zone": ZONE, "pricing": "spot"},
            "command": {"cmd": "python train.py"}, "priority": priority,
            "recovery": {"on_preempted": "resume", "max_restarts": 5}}


def job(store, job_id: str, accelerator: str, priority: int, start: float, end: float | None = None) -> None:
    """A job submitted `start` hours ago that ran until `end` hours ago (None: it runs)."""
    name = "tl-" + job_id.replace("/", "-")
    tpu = {"name": name, "zone": ZONE, "kind": "node", "accelerator": accelerator}
    events = [("submitted", {"spec": spec(accelerator, priority), "spec_hash": "ab" * 32, "commit": "c0ffee",
                             "path": f"jobs/{job_id}.yaml"}, start),
              ("provisioning", {"attempt": 1, "tpu": tpu}, start), ("provisioned", {"tpu": tpu, "hosts": [{"worker": 0}]}, start),
              ("setup_started", {}, start), ("setup_done", {}, start), ("started", {"attempt": 1}, start)]
    if end is not None:
        events += [("finished", {"attempt": 1, "exit_codes": {"0": 0}}, end), ("released", {"tpu": tpu}, end)]
    store.append(job_id, [NewEvent(t, d, actor("git", "lab"), time=at(h)) for t, d, h in events])


def waiting(store, job_id: str, accelerator: str, priority: int, hours_ago: float) -> None:
    data = {"spec": spec(accelerator, priority), "spec_hash": "ab" * 32, "commit": "c0ffee", "path": f"jobs/{job_id}.yaml"}
    store.append(job_id, [NewEvent("submitted", data, actor("git", "lab"), time=at(hours_ago))])


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/sharing-lab")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ledger.db").unlink(missing_ok=True)
    store = open_store(f"sqlite:///{folder / 'ledger.db'}")
    try:
        # Last week: nlp ran the most, infra a little, vision hardly at all.
        job(store, "alice/pretrain", "v4-64", 500, 120, 60)
        job(store, "bob/ablation", "v4-32", 100, 90, 70)
        job(store, "erin/ci-nightly", "v4-8", 500, 100, 40)
        job(store, "carol/baseline", "v4-16", 500, 30, 26)
        # Now: the lab's 64 chips are nearly all held.
        job(store, "alice/finetune", "v4-64", 500, 3)
        job(store, "bob/sweep-1", "v4-16", 100, 2)
        job(store, "carol/segmenter", "v4-32", 500, 1.5)
        job(store, "erin/ci", "v4-8", 500, 0.5)
        # The queue.
        waiting(store, "dave/detector", "v4-16", 900, 0.4)
        waiting(store, "bob/sweep-2", "v4-16", 100, 0.3)
        waiting(store, "alice/eval", "v4-8", 500, 0.2)
        waiting(store, "bob/sweep-3", "v4-8", 100, 0.1)
        waiting(store, "erin/huge", "v4-128", 500, 0.05)
        record_policy(store, load_policy(POLICY), source=str(POLICY), holder="sharing-lab")
    finally:
        store.close()
    print(f"sqlite:///{folder / 'ledger.db'}")


if __name__ == "__main__":
    main()
