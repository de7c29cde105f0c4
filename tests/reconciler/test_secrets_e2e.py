"""Secrets end to end on the TPU emulator: a job gets its owner's secret and a key of its own;
its host never receives the reconciler's key, not even when a spec in the ledger names it."""

from __future__ import annotations

import threading
from dataclasses import replace

from ledger.app.wiring import build
from ledger.fold import CANCELLED, FINISHED, RUNNING
from ledger.store import open_store
from reconciler.keys import JobKeys, ensure_key
from tests.reconciler.conftest import job_spec


def start(harness, secrets_dir):
    rec = build(replace(harness.settings(), secrets_dir=secrets_dir))
    thread = threading.Thread(target=rec.run, kwargs={"stop": harness.stop}, daemon=True)
    thread.start()
    harness.reconcilers.append(rec)
    harness.threads.append(thread)
    return rec


def test_a_job_gets_its_owners_secret_and_its_own_key_never_the_reconcilers(harness):
    secrets = harness.tmp / "secrets"
    (secrets / "alice").mkdir(parents=True)
    (secrets / "alice" / "id_deploy").write_text("ALICE DEPLOY KEY\n")
    reconciler_public = ensure_key(harness.settings().ssh_key)
    reconciler_private = harness.settings().ssh_key.read_text()
    spec = job_spec('cat ~/.ssh/*; sleep 2; echo done', workers=[0],
                    setup={"modules": ["ssh", "command"]}, ssh={"identities": [{"private_key": "secret://id_deploy"}]})
    harness.submit("alice/deploy", spec)
    start(harness, secrets)
    harness.wait("alice/deploy", lambda j: j.state == RUNNING)
    [node] = harness.nodes()
    keys = node.metadata["ssh-keys"]
    job_public = JobKeys(harness.settings().ssh_key.parent / "jobs").public("alice/deploy")
    assert keys == f"ledger:{job_public}"  # the job's own key, and only it
    assert reconciler_public.split()[1] not in keys
    harness.wait("alice/deploy", lambda j: j.state == FINISHED)
    out = harness.output("alice/deploy", 1)
    # the job received its key (its command printed it), and what was collected masks it
    assert "[redacted******]" in out and "ALICE DEPLOY KEY" not in out and out.rstrip().endswith("done")
    logs = harness.settings().log_dir / "alice" / "deploy"
    assert "ALICE DEPLOY KEY" not in "".join(p.read_text(errors="replace") for p in logs.rglob("*") if p.is_file())
    body = "".join(reconciler_private.splitlines()[1:-1])
    assert body[:40] not in out.replace("\n", "")
    harness.verify()


def test_a_spec_in_the_ledger_naming_the_reconcilers_key_fails_setup_without_copying_it(harness):
    """Defence in depth: a spec that reached the ledger without the validator (an old
    version, a hand-written event) is refused again when the reconciler reads the file."""
    secrets = harness.tmp / "secrets"
    (secrets / "mallory").mkdir(parents=True)
    key = harness.settings().ssh_key
    ensure_key(key)
    (secrets / "mallory" / "innocent").symlink_to(key)
    for name, ref in (("abs", str(key)), ("link", "secret://innocent"), ("dotdot", "../../ssh/id_ecdsa")):
        spec = job_spec("cat ~/.ssh/*", workers=[0], setup={"modules": ["ssh", "command"]},
                        ssh={"identities": [{"private_key": ref}]}, recovery={"max_restarts": 0})
        harness.submit(f"mallory/{name}", spec)
    start(harness, secrets)
    why = {"abs": "reconciler's own SSH key", "link": "outside mallory's secrets folder", "dotdot": "`..`"}
    for name, needle in why.items():
        job = harness.wait(f"mallory/{name}", lambda j: "setup_failed" in harness.types(j.id), timeout=90)
        assert job.state != RUNNING
        assert harness.output(f"mallory/{name}", 1) == ""
        store = open_store(harness.store_url)
        try:
            reasons = [e.data["reason"] for e in store.read_stream(f"mallory/{name}") if e.type == "setup_failed"]
        finally:
            store.close()
        assert reasons and needle in reasons[0], reasons


def test_job_keys_are_per_job_private_and_stable(tmp_path):
    keys = JobKeys(tmp_path / "jobs")
    a, b = keys.public("alice/a"), keys.public("bob/b")
    assert a != b and keys.public("alice/a") == a  # made once, then reused
    path = keys.existing("alice/a")
    assert path is not None and path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert "alice" not in str(path)  # the folder is a digest: a job id never becomes a path
    assert keys.existing("carol/never") is None


def test_a_jobs_key_is_deleted_once_the_job_ended_and_its_tpu_is_released(harness):
    keys = JobKeys(harness.settings().ssh_key.parent / "jobs")
    harness.submit("alice/short", job_spec("echo done", workers=[0]))
    harness.submit("bob/long", job_spec("sleep 300", workers=[0]))
    harness.start()
    harness.wait("bob/long", lambda j: j.state == RUNNING)
    assert keys.path("bob/long").is_file()  # made when its TPU was created
    harness.wait("alice/short", lambda j: j.state == FINISHED and j.tpu is None)
    assert not keys.path("alice/short").exists() and not keys.path("alice/short").parent.exists()
    assert keys.path("bob/long").is_file()  # a running job keeps its key
    harness.append("bob/long", "cancel_requested", {"reason": "spec deleted"})
    harness.wait("bob/long", lambda j: j.state == CANCELLED and j.tpu is None)
    assert not keys.path("bob/long").exists()
    harness.verify()


def test_a_job_whose_tpu_cannot_be_made_leaves_no_key(harness):
    keys = JobKeys(harness.settings().ssh_key.parent / "jobs")
    harness.submit("carol/bad", job_spec("true", accelerator="v4-7", workers=[0]))
    harness.start()
    job = harness.wait("carol/bad", lambda j: j.terminal)
    assert "provision_failed" in harness.types("carol/bad"), harness.types("carol/bad")
    assert job.tpu is None and not keys.path("carol/bad").exists()
