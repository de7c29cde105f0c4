"""A preemption reaches `preempted` through the hosts' watchers, not the next poll.

The reconciler polls once an hour here: a preemption on the emulator (the node reads
PREEMPTED and its hosts die, their connections with them) must still be recorded, because
the watchers wake the loop the moment the hosts' connections drop; the TPU API's answer, read
on that pass, decides it was a preemption.
"""

from __future__ import annotations

from ledger.fold import RUNNING
from tests.reconciler.conftest import Harness, job_spec


def test_a_preemption_is_recorded_without_waiting_for_the_next_poll(harness: Harness):
    harness.submit("carol/spot", job_spec("echo up; sleep 300", accelerator="v4-32"))
    rec = harness.start()
    job = harness.wait("carol/spot", lambda j: j.state == RUNNING)
    # every host watched: the passes after `started` armed one watcher per host
    harness.wait("carol/spot", lambda j: len(rec.runner.watchers) == len(j.hosts))
    rec.interval = 3600.0  # from now on the loop polls once an hour
    passes = rec.passes
    harness.wait("carol/spot", lambda j: rec.passes > passes)  # the last short wait is over
    woken, wake = [], rec.wake
    rec.wake = lambda: woken.append(1) or wake()  # the runner's watchers call this
    harness.emu.preempt(job.tpu["name"])
    after = harness.wait("carol/spot", lambda j: "preempted" in harness.types("carol/spot"), timeout=120)
    assert woken and after.attempt == 1
    preempted = [t for t in harness.types("carol/spot") if t in ("preempted", "failed")]
    assert preempted[0] == "preempted"  # the API decided: a preemption, not a lost host
    rec.interval = 0.3
    rec.wake()
    harness.verify()
