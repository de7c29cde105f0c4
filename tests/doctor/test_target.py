"""What `ledger doctor JOB|TPU` examines, found from the ledger's index (`load_lazy`), not from
every job decoded: a job by id, a TPU by its live holder, or by the last job that held it.
A real SQLite file with a snapshot and events after it; no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.app.commands.doctor import _target
from ledger.errors import UsageError
from ledger.events import NewEvent
from ledger.replay import load_lazy, load_state, save_snapshot
from ledger.store.sqlite import SQLiteStore
from tests.reconciler.test_live import ZONE, at
from tests.reconciler.test_live import events as live_events


def test_doctor_finds_its_job_and_tpu_from_the_index(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ledger.db")
    try:
        for job_id, type_, data, ago in live_events():
            store.append(job_id, [NewEvent(type_, data, time=at(ago))])
        save_snapshot(store, load_state(store))
        store.append("cy/cancelled", [NewEvent("rerun", {"rule": "manual", "attempt": 2, "restarts": 0}, time=at(5))])
        lazy, full = load_lazy(store), load_state(store).jobs

        assert _target(lazy, "ana/running") == (full["ana/running"], full["ana/running"].tpu)
        assert _target(lazy, "tl-ana-running") == (full["ana/running"], full["ana/running"].tpu)  # its live holder
        # a TPU a job released: the last job that used it says where it is and takes the repairs
        assert _target(lazy, "tl-bo-old") == (None, {"name": "tl-bo-old", "zone": ZONE, "shared": False, "last_job": "bo/old"})
        # a TPU an ended job still holds (its release not done yet): that job, though not live
        assert _target(lazy, "tl-cy-holding")[1] == {"name": "tl-cy-holding", "zone": ZONE, "shared": False,
                                                     "last_job": "cy/holding"}
        assert _target(lazy, "tl-nobody") == (None, {"name": "tl-nobody", "zone": None, "shared": False, "last_job": None})
        with pytest.raises(UsageError, match="holds no TPU now"):
            _target(lazy, "ana/waiting")
        # decoded: the event's job and those it named, never the rest (a lab's 118,956)
        assert set(lazy._jobs) == {"cy/cancelled", "ana/running", "bo/old", "cy/holding", "ana/waiting"}
    finally:
        store.close()
