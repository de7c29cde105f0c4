"""A small ledger with fixed times, written the way the reconciler writes it, whose every
usage figure is worked out by hand in test_usage_fold.py. Shared with the CLI test, which
stores it in a real SQLite file."""

from __future__ import annotations

import json

DAY = "2026-03-02"


def at(hhmm: str) -> str:
    """'10:21' or '10:21:30' on DAY as an event time."""
    if hhmm.count(":") == 1:
        hhmm += ":00"
    return f"{DAY}T{hhmm}.000000Z"


def spec(accelerator: str, zone: str, pricing: str) -> dict:
    return {"tpu": {"accelerator": accelerator, "zone": zone, "pricing": pricing}}


def submitted(accelerator: str, zone: str, pricing: str) -> dict:
    return {"spec": spec(accelerator, zone, pricing), "spec_hash": "ab12cd34", "commit": "c0ffee00", "path": "jobs/x.yaml",
            "author": "a@lab.example", "approvers": ["s@lab.example"]}


BERT_TPU1 = {"name": "n1", "zone": "us-central2-b", "kind": "node", "shared": False, "accelerator": "v4-32", "attempt": 1}
BERT_TPU2 = {**BERT_TPU1, "name": "n2", "attempt": 2}
GPT_TPU1 = {"name": "n3", "zone": "us-central2-b", "kind": "node", "shared": False, "accelerator": "v4-8", "attempt": 1}
GPT_TPU3 = {**GPT_TPU1, "name": "n4", "attempt": 3}
EVAL_QR = {"name": "qr1", "zone": "us-west4-a", "kind": "queued_resource", "shared": False, "accelerator": "v5litepod-4",
           "attempt": 1}

# (stream, type, time, data), in seq order: three jobs interleaved as the ledger holds them.
EVENTS: list[tuple[str, str, str, dict]] = [
    # alice/bert: v4-32 (16 chips), spot. Waits for capacity, runs, checkpoints, is preempted,
    # comes back on a new TPU (reapply) from the checkpoint, finishes.
    ("alice/bert", "submitted", at("10:00"), submitted("v4-32", "us-central2-b", "spot")),
    ("bob/gpt", "submitted", at("10:00"), submitted("v4-8", "us-central2-b", "ondemand")),
    ("alice/eval", "submitted", at("10:00"), submitted("v5litepod-4", "us-west4-a", "reserved")),
    ("alice/bert", "queued", at("10:00:30"), {"reason": "no capacity for v4-32 in us-central2-b"}),
    ("alice/eval", "action_intent", at("10:01"), {"action_id": "x1", "action": "provision", "params": {}}),
    ("alice/eval", "action_outcome", at("10:01"), {"action_id": "x1", "action": "provision", "ok": True}),
    ("alice/eval", "provisioning", at("10:01"), {"attempt": 1, "tpu": EVAL_QR, "how": "created"}),
    ("bob/gpt", "provisioning", at("10:02"), {"attempt": 1, "tpu": GPT_TPU1, "how": "created"}),
    ("alice/eval", "queued", at("10:02"), {"reason": "queued resource qr1 is WAITING_FOR_RESOURCES"}),
    ("bob/gpt", "provisioned", at("10:04"), {"tpu": GPT_TPU1, "hosts": [{"worker": 0}]}),
    ("bob/gpt", "setup_started", at("10:05"), {"attempt": 1}),
    ("bob/gpt", "setup_done", at("10:07"), {"attempt": 1}),
    ("bob/gpt", "started", at("10:08"), {"attempt": 1, "workers": [0], "resume": False}),
    ("alice/bert", "provisioning", at("10:10"), {"attempt": 1, "tpu": BERT_TPU1, "how": "created"}),
    ("alice/bert", "provisioned", at("10:15"), {"tpu": BERT_TPU1, "hosts": []}),
    ("alice/bert", "setup_started", at("10:16"), {"attempt": 1}),
    ("alice/bert", "setup_done", at("10:20"), {"attempt": 1}),
    ("alice/bert", "started", at("10:21"), {"attempt": 1, "workers": [0, 1, 2, 3], "resume": False}),
    ("alice/eval", "provisioned", at("10:30"), {"tpu": EVAL_QR, "hosts": [{"worker": 0}]}),
    ("alice/eval", "setup_started", at("10:31"), {"attempt": 1}),
    ("alice/eval", "setup_done", at("10:32"), {"attempt": 1}),
    ("alice/eval", "started", at("10:33"), {"attempt": 1, "workers": [0], "resume": False}),
    ("bob/gpt", "failed", at("10:38"), {"kind": "grpc", "message": "GRPC error", "attempt": 1}),
    ("bob/gpt", "resumed", at("10:39"), {"attempt": 2, "restarts": 1, "rule": "resume", "reapply": False, "kind": "grpc"}),
    ("bob/gpt", "setup_started", at("10:40"), {"attempt": 2}),
    ("bob/gpt", "setup_done", at("10:41"), {"attempt": 2}),
    ("bob/gpt", "started", at("10:42"), {"attempt": 2, "workers": [0], "resume": True}),
    ("alice/bert", "checkpointed", at("10:45"), {"attempt": 1, "step": 200}),
    ("alice/bert", "checkpointed", at("10:51"), {"attempt": 1, "step": 300}),
    # bob's host vanishes: recorded as a failure first; the recovery then says it was a
    # preemption (the TPU reads PREEMPTED), so it counts as one, with its lost work.
    ("bob/gpt", "failed", at("10:52"), {"kind": "lost_host", "worker": 0, "message": "worker 0 lost", "attempt": 2}),
    ("bob/gpt", "released", at("10:53"), {"tpu": GPT_TPU1, "reason": "reapply", "deleted": True}),
    ("bob/gpt", "resumed", at("10:53"), {"attempt": 3, "restarts": 2, "rule": "resume", "reapply": True, "kind": "preempted"}),
    ("bob/gpt", "provisioning", at("10:55"), {"attempt": 3, "tpu": GPT_TPU3, "how": "created"}),
    ("bob/gpt", "provisioned", at("10:57"), {"tpu": GPT_TPU3, "hosts": [{"worker": 0}]}),
    ("bob/gpt", "setup_started", at("10:58"), {"attempt": 3}),
    ("bob/gpt", "setup_done", at("10:59"), {"attempt": 3}),
    ("alice/bert", "preempted", at("11:00"), {"tpu_state": "PREEMPTED", "reason": "TPU n1 is PREEMPTED", "attempt": 1}),
    ("bob/gpt", "started", at("11:00"), {"attempt": 3, "workers": [0], "resume": True}),
    ("_system", "note", at("11:00"), {"text": "not a job"}),
    ("alice/bert", "action_intent", at("11:01"), {"action_id": "x2", "action": "recover", "params": {}}),
    ("alice/bert", "action_outcome", at("11:01"), {"action_id": "x2", "action": "recover", "ok": True}),
    ("alice/bert", "released", at("11:01"), {"tpu": BERT_TPU1, "reason": "reapply", "deleted": True}),
    ("alice/bert", "resumed", at("11:01"), {"attempt": 2, "restarts": 1, "rule": "resume", "reapply": True, "kind": "preempted"}),
    ("carol/sweep", "submitted", at("11:00"), submitted("v4-8", "us-central2-b", "ondemand")),
    ("carol/sweep", "queued", at("11:00:10"), {"reason": "no capacity"}),
    ("alice/bert", "provisioning", at("11:05"), {"attempt": 2, "tpu": BERT_TPU2, "how": "created"}),
    ("alice/bert", "provisioned", at("11:08"), {"tpu": BERT_TPU2, "hosts": []}),
    ("alice/bert", "setup_started", at("11:09"), {"attempt": 2}),
    ("alice/bert", "setup_done", at("11:12"), {"attempt": 2}),
    ("alice/bert", "started", at("11:13"), {"attempt": 2, "workers": [0, 1, 2, 3], "resume": True}),
    ("carol/sweep", "cancel_requested", at("11:20"), {"reason": "file deleted"}),
    ("carol/sweep", "cancelled", at("11:20"), {"reason": "cancel requested"}),
    ("bob/gpt", "cancel_requested", at("11:30"), {"reason": "file deleted"}),
    ("bob/gpt", "released", at("11:31"), {"tpu": GPT_TPU3, "reason": "cancelled", "deleted": True}),
    ("bob/gpt", "cancelled", at("11:31"), {"reason": "cancel requested"}),
    ("carol/sneaky", "rejected", at("11:40"), {"reason": "no approval"}),
    ("alice/bert", "finished", at("12:13"), {"attempt": 2, "exit_codes": {"0": 0}}),
    ("alice/bert", "released", at("12:15"), {"tpu": BERT_TPU2, "reason": "job ended", "deleted": True}),
]
NOW = at("12:33")  # the report's moment: alice/eval is still running


def rows(events=EVENTS) -> list[tuple]:
    """As the store's fold_rows yields them: (seq, stream, version, type, time, data JSON)."""
    versions: dict[str, int] = {}
    out = []
    for seq, (stream, type_, time, data) in enumerate(events, 1):
        versions[stream] = versions.get(stream, 0) + 1
        out.append((seq, stream, versions[stream], type_, time, json.dumps(data, sort_keys=True, separators=(",", ":"))))
    return out
