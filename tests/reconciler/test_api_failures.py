"""Every kind of TPU API failure, against the emulator through the real google-cloud-tpu
client, in the create's call and inside its operation: what the job does, what the ledger
records (and that it verifies), and that no traceback is logged."""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import pytest
from click.testing import CliRunner

from ledger import defaults, fold
from ledger.app.cli import cli
from ledger.app.observability.collectors import JobsCollector, JobSources
from ledger.app.wiring import build
from ledger.failures import from_status
from ledger.fold import evolve, initial
from ledger.store import open_store
from reconciler.health import ZoneHealth
from reconciler.loop import Reconciler, ended_backoffs
from reconciler.model import NodeObs, Observed
from tests.reconciler.conftest import ZONE, Harness, job_spec

JOB = "alice/refused"


def run_once(h: Harness, timeout: float = 30) -> Reconciler:
    """`ledger reconcile --once`, as the CLI runs it."""
    rec = build(h.settings())
    try:
        rec.run(once=True, timeout=timeout)
    finally:
        rec.drain(timeout=30)
        rec.close()
    return rec


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if r.exc_info], "a failure the cloud can cause logged a traceback"


@pytest.mark.parametrize(("where", "code", "reason"), [
    ("call", "PERMISSION_DENIED", ""),
    ("operation", "PERMISSION_DENIED", ""),
    ("call", "INVALID_ARGUMENT", ""),
    ("operation", "UNAUTHENTICATED", ""),
])
def test_a_permanent_refusal_blocks_the_job_with_one_line_and_no_more_calls(
        harness: Harness, caplog: pytest.LogCaptureFixture, where: str, code: str, reason: str) -> None:
    caplog.set_level(logging.INFO)
    if where == "call":
        harness.emu.fail_calls("CreateNode", code, reason=reason)
    else:
        harness.emu.fail_creations(1, code=code, reason=reason)
    harness.submit(JOB, job_spec("true", setup={"modules": []}))
    run_once(harness)
    if where == "operation":  # the create was accepted; its operation failed after the create delay
        time.sleep(0.5)
        run_once(harness)
    job = harness.job(JOB)
    assert job.state == fold.BLOCKED and not job.terminal
    line = job.last_error["message"]
    assert line.startswith(f"{code}: ") and "\n" not in line
    if code == "PERMISSION_DENIED":
        assert line.startswith(f"PERMISSION_DENIED: tpu.nodes.create on projects/{defaults.PROJECT}/locations/{ZONE}")
        assert "grant roles/tpu.admin to the reconciler's service account" in line
    harness.verify()
    # blocked: another pass makes no API call for it
    rec = run_once(harness)
    assert rec.tpu.calls == 0
    assert harness.job(JOB).state == fold.BLOCKED
    # `ledger resume` (an operator fixed the cause) tries again, and it works now
    harness.append(JOB, "resumed", {"attempt": job.attempt + 1, "restarts": job.restarts, "rule": "manual", "reapply": True})
    run_once(harness)
    assert harness.job(JOB).state in (fold.PROVISIONED, fold.SETTING_UP, fold.READY, fold.RUNNING, fold.FINISHED)
    harness.verify()
    no_tracebacks(caplog)


@pytest.mark.parametrize(("where", "reason", "kind"), [
    ("call", "QUOTA_EXCEEDED", "quota"),
    ("operation", "", "stockout"),
])
def test_a_capacity_refusal_queues_the_job_with_the_apis_answer_and_the_placement(
        harness: Harness, caplog: pytest.LogCaptureFixture, where: str, reason: str, kind: str) -> None:
    if where == "call":
        harness.emu.fail_calls("CreateNode", "RESOURCE_EXHAUSTED", reason=reason)
    else:
        harness.emu.fail_creations(1, code="RESOURCE_EXHAUSTED", reason=reason)
    harness.submit(JOB, job_spec("true", setup={"modules": []}))
    run_once(harness)
    if where == "operation":
        time.sleep(0.5)
        run_once(harness)
    store = open_store(harness.store_url)
    queued = [e.data for e in store.read_stream(JOB) if e.type == "queued" and e.data.get("api")]
    store.close()
    assert queued, harness.types(JOB)
    api, placement = queued[0]["api"], queued[0]["placement"]
    assert api["code"] == "RESOURCE_EXHAUSTED" and api["kind"] == kind and api["message"]
    assert placement == {"zone": ZONE, "accelerator": "v4-8", "pricing": "spot", "kind": "node"}
    assert harness.job(JOB).state not in (fold.BLOCKED, fold.FAILED_FINAL)  # it waits, then tries again
    harness.verify()
    no_tracebacks(caplog)


@pytest.mark.parametrize("where", ["call", "operation"])
def test_a_transient_failure_records_at_most_its_outcome_and_the_job_carries_on(
        harness: Harness, caplog: pytest.LogCaptureFixture, where: str) -> None:
    if where == "call":
        harness.emu.fail_calls("CreateNode", "UNAVAILABLE")
    else:
        harness.emu.fail_creations(1, code="INTERNAL")
    harness.submit(JOB, job_spec("true", setup={"modules": []}))
    run_once(harness)
    time.sleep(1.2)  # past the zone's first backoff step
    run_once(harness)
    time.sleep(1.2)
    run_once(harness)
    job = harness.job(JOB)
    assert job.state not in (fold.BLOCKED, fold.FAILED_FINAL), harness.types(JOB)
    store = open_store(harness.store_url)
    outcomes = [e.data for e in store.read_stream(JOB) if e.type == "action_outcome" and not e.data["ok"]]
    store.close()
    assert len(outcomes) <= 1 and all(o["api"]["kind"] == "transient" for o in outcomes)
    harness.verify()
    no_tracebacks(caplog)


def test_an_outage_is_recorded_once_calls_back_off_and_work_resumes(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tpu_ledger.reconciler")
    harness.submit(JOB, job_spec("sleep 3", setup={"modules": []}))
    rec = build(harness.settings())
    rec.health = ZoneHealth(initial=0.2, maximum=0.8, down_after=0.5)
    rec.tpu.on_reconnect(rec.health.wake)
    try:
        deadline = time.monotonic() + 30
        while harness.job(JOB).state != fold.RUNNING and time.monotonic() < deadline:
            rec.step()
            rec.drain(10)
        assert harness.job(JOB).state == fold.RUNNING
        store = open_store(harness.store_url)
        head = store.head()
        harness.emu.outage("refuse")
        calls, start = rec.tpu.calls, time.monotonic()
        while time.monotonic() - start < 3:
            rec.step()
            rec.drain(10)
            time.sleep(0.05)
        during = rec.tpu.calls - calls
        added = [(e.stream, e.type) for e in store.read_all() if e.seq > head]
        assert added == [(defaults.CLOUD_STREAM, "api_unreachable")], added
        assert during <= 3 / 0.2 + 1, f"{during} calls in 3 s of outage"  # at most one per backoff step
        harness.emu.outage(None)
        deadline = time.monotonic() + 30
        while harness.job(JOB).state == fold.RUNNING and time.monotonic() < deadline:
            rec.step()
            rec.drain(10)
            time.sleep(0.05)
        assert harness.job(JOB).state == fold.FINISHED
        kinds = [e.type for e in store.read_stream(defaults.CLOUD_STREAM)]
        assert kinds == ["api_unreachable", "api_reachable"]
        store.close()
    finally:
        rec.close()
    harness.verify()
    no_tracebacks(caplog)
    lines = [r.getMessage() for r in caplog.records if r.name == "tpu_ledger.reconciler" and "TPU API of zone" in r.getMessage()]
    assert len(lines) == 2, lines


def test_a_delete_refused_for_good_says_so_on_the_job_and_is_tried_again_only_now_and_then(
        harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    """PERMISSION_DENIED on the delete: the job (still cancelling, its TPU billing) names the
    permission to grant, and the release is tried again every `release_refused_retry_s`, not
    at the action backoff's pace (each try records an intent and an outcome)."""
    harness.submit(JOB, job_spec("sleep 60", setup={"modules": []}))
    retry_s = 3.0
    rec = build(dataclasses.replace(harness.settings(), release_refused_retry_s=retry_s))
    try:
        deadline = time.monotonic() + 30
        while harness.job(JOB).state != fold.RUNNING and time.monotonic() < deadline:
            rec.step()
            rec.drain(10)
        harness.emu.fail_calls("DeleteNode", "PERMISSION_DENIED", n=2)
        harness.append(JOB, "cancel_requested", {"reason": "test"})
        passes = 0
        while (harness.job(JOB).last_error or {}).get("kind") != "release" and passes < 200:
            rec.step()
            rec.drain(10)
            passes += 1
        job = harness.job(JOB)
        assert job.state == fold.CANCELLING and job.tpu is not None
        assert job.last_error["code"] == "PERMISSION_DENIED" and job.last_error["permission"] == "tpu.nodes.delete"
        refused_at = time.monotonic()
        while time.monotonic() - refused_at < retry_s * 0.6:  # well within the wait: no try at all
            rec.step()
            rec.drain(10)
            time.sleep(0.05)
        assert len(refusals(harness)) == 1, "the refused delete was asked again before its retry time"
        rec.step()  # its fold catches up with the outcome (a retry refused again changes nothing of it: n=2)
        assert release_refused_gauge(rec) == 1  # what the TpuLedgerReleaseRefused alert reads
        for args in (["--json"], ["--wide"]):  # `ledger inspect` says it, in JSON and in words
            shown = CliRunner().invoke(cli, ["--store", harness.store_url, "inspect", JOB, *args], catch_exceptions=False)
            assert shown.exit_code == 0, shown.output
        assert json.loads(CliRunner().invoke(cli, ["--store", harness.store_url, "inspect", JOB, "--json"]).output)[
            "release_refused"]["permission"] == "tpu.nodes.delete"
        assert "release refused: PERMISSION_DENIED: tpu.nodes.delete" in shown.output and "keeps billing" in shown.output
        listed = CliRunner(env={"COLUMNS": "300"}).invoke(cli, ["--store", harness.store_url, "list"], catch_exceptions=False)
        assert f"{JOB}: release refused: PERMISSION_DENIED: tpu.nodes.delete" in listed.output, listed.output
        deadline = time.monotonic() + 30
        while harness.job(JOB).state != fold.CANCELLED and time.monotonic() < deadline:
            rec.step()
            rec.drain(10)
            time.sleep(0.05)
        job = harness.job(JOB)
        assert job.state == fold.CANCELLED and job.tpu is None and job.last_error is None
        assert len(refusals(harness)) == 2  # n=2: the second try refused too, the third deleted it
        rec.step()
        assert release_refused_gauge(rec) == 0
    finally:
        rec.close()
    harness.verify()
    no_tracebacks(caplog)


def release_refused_gauge(rec: Reconciler) -> float:
    collector = JobsCollector(JobSources(jobs=lambda: rec.state.jobs, policy=lambda: None, queue=lambda: None))
    return next(s.value for m in collector.collect() for s in m.samples if s.name == "tpu_ledger_release_refused")


def refusals(harness: Harness) -> list[dict]:
    store = open_store(harness.store_url)
    try:
        found = [e.data for e in store.read_stream(JOB) if e.type == "action_outcome" and not e.data["ok"]]
    finally:
        store.close()
    assert all(o["api"]["code"] == "PERMISSION_DENIED" for o in found)
    return found


def test_backoffs_of_jobs_that_ended_or_orphans_that_went_are_forgotten() -> None:
    spec = {"spec": job_spec("x"), "spec_hash": "h", "commit": "c"}
    live = evolve(initial("a/live"), "submitted", spec)
    ended = evolve(evolve(initial("a/ended"), "submitted", spec), "cancelled", {})
    backoff = ZoneHealth()
    failure = from_status({"code": "PERMISSION_DENIED", "message": "no"})
    for key in ("a/live", "a/ended", "a/unknown", "orphan:kept", "orphan:gone"):
        backoff.failed(key, failure, 0.0)
    obs = Observed(now=1.0, zones=frozenset({ZONE}), nodes={"kept": NodeObs("kept", ZONE, "READY")})
    stale = ended_backoffs(backoff.names(), {j.id: j for j in (live, ended)}, obs)
    assert sorted(stale) == ["a/ended", "a/unknown", "orphan:gone"]
    backoff.forget(stale)
    assert sorted(backoff.names()) == ["a/live", "orphan:kept"]
