"""Progress under a crash loop: the reconciler kill -9'd every 3 s and started again.

An action a dead process left under way is taken up by the next one from where it stands: the
release is carried on under its one intent (a delete under way is awaited, not started again),
and every job ends with its TPU deleted. How fast: bench/crashloop_bench.py.
"""

from __future__ import annotations

from ledger.fold import FAILED_FINAL, FINISHED
from tests.reconciler.conftest import Harness
from tests.reconciler.crashloop import intent_outcome_times, run_crash_loop

JOBS = {"gus/a": "exit 0", "gus/b": "exit 0", "gus/c": "exit 3"}


def test_releases_are_carried_on_under_a_kill_loop(harness: Harness):
    loop = run_crash_loop(harness, JOBS, crash_at="release:intent")
    assert loop.kills >= 3
    states = {job_id: harness.job(job_id).state for job_id in JOBS}
    assert states == {"gus/a": FINISHED, "gus/b": FINISHED, "gus/c": FAILED_FINAL}, states
    releases = intent_outcome_times(harness.store_url, "release")
    assert sorted(job for job, _ in releases) == sorted(JOBS), releases  # one release each, never begun again
    assert all(t is not None for _, t in releases), releases
    print("release intent -> outcome (s):", sorted(round(t, 2) for _, t in releases), "kills", loop.kills)
    for job_id in JOBS:
        types = harness.types(job_id)
        assert types.count("provisioning") == 1 and types.count("released") == 1, (job_id, types)
    harness.verify()
    assert harness.nodes() == []
