"""What the reconciler keeps from one pass to the next instead of making it again: the
fair-share figures. The real reconciler over the emulator and a real SQLite ledger."""

from __future__ import annotations

import time

from ledger import defaults
from ledger.app.wiring import build
from ledger.usage.fold import WAITING
from reconciler import admission
from tests.admission.conftest import LabHarness
from tests.reconciler.conftest import job_spec


def test_fair_share_figures_are_made_again_only_when_usage_the_meter_or_the_clock_moved(lab_harness: LabHarness):
    h = lab_harness
    clock = [time.time()]
    rec = build(h.settings(), clock=lambda: clock[0])
    try:
        h.submit("alice/a", job_spec("sleep 60", accelerator="v4-8"))
        h.append("alice/a", "provisioning", {"attempt": 1, "tpu": {"name": "t-a", "zone": "us-central2-b",
                                                                   "accelerator": "v4-8", "kind": "node"}})
        h.submit("bob/b", job_spec("sleep 60", accelerator="v4-8"))
        rec.catch_up()
        now = clock[0]
        first = rec.recent_usage(now)
        assert rec.recent_usage(now + 1) is first  # nothing was recorded, the clock barely moved
        us = int((now + 1) * 1_000_000)
        every = rec.usage.open_intervals(us)
        assert {iv.category for iv in every} >= {WAITING}  # bob waits: his interval is left out
        assert rec.usage.open_intervals(us, held=True) == [iv for iv in every if iv.category != WAITING]

        h.submit("carol/c", job_spec("sleep 60", accelerator="v4-8"))
        rec.catch_up()
        moved = rec.recent_usage(now + 2)
        assert moved is not first  # the usage fold moved
        later = rec.recent_usage(now + 2 + defaults.FAIR_SHARE_REFRESH_S)
        assert later is not moved  # the clock did
        at = int((now + 2 + defaults.FAIR_SHARE_REFRESH_S) * 1_000_000)
        assert later == admission.usage_at(rec.meter, rec.usage.open_intervals(at), at)
        assert later.decayed["alice"] > 0 and "bob" not in later.decayed
    finally:
        rec.close()
