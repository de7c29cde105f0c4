"""Checkpoint reporting end to end: a line the job prints on a real SSH host of the emulator
becomes one `checkpointed` event (the same step printed again adds none), and the ledger
still verifies."""

from __future__ import annotations

from ledger.fold import FINISHED
from tests.reconciler.conftest import Harness, job_spec

CORE = ["provisioning", "provisioned", "setup_started", "setup_done", "started"]


def test_a_printed_checkpoint_line_becomes_one_event(harness: Harness):
    cmd = ('echo "loading"; echo "LEDGER_CHECKPOINT step=7"; sleep 1.5; '
           'echo "LEDGER_CHECKPOINT step=7"; echo "not a checkpoint: step=8"; sleep 1.5; echo done')
    harness.submit("alice/ckpt", job_spec(cmd))
    harness.start()
    job = harness.wait("alice/ckpt", lambda j: j.state == FINISHED and j.tpu is None)
    assert harness.types("alice/ckpt") == ["submitted", *CORE, "checkpointed", "finished", "released"]
    assert job.checkpoint == {"attempt": 1, "step": 7}
    harness.verify()
