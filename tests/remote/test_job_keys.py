"""Per-job SSH keys against a real sshd: a host is reached with its job's key, and a TPU made
before per-job keys (holding the reconciler's key) is still reached."""

from __future__ import annotations

from dataclasses import replace

import paramiko
import pytest

from reconciler.keys import JobKeys, derive_job_key, ensure_key
from reconciler.remote import AuthFailed, RemoteRunner


def runner(pod, tmp_path, pool_key) -> RemoteRunner:
    return RemoteRunner(private_key_path=pool_key, known_hosts_path=tmp_path / "known_hosts", log_dir=tmp_path / "logs",
                        username=pod.hosts[0].username, secrets_dir=tmp_path / "secrets", retries=0, backoff=0.1)


def test_a_host_is_reached_with_its_own_key_not_the_pools(pod, tmp_path):
    stranger = tmp_path / "stranger"
    ensure_key(stranger)  # the pool's key: not authorized on the pod
    r = runner(pod, tmp_path, stranger)
    try:
        h = pod.hosts[0]
        with pytest.raises(AuthFailed):
            r.run(h, "true")
        assert r.run(replace(h, key_path=pod.client_key), "echo job key").stdout == b"job key\n"
    finally:
        r.close()


def test_a_host_without_the_job_key_is_reached_with_the_reconcilers(pod, tmp_path):
    job_key = tmp_path / "job" / "id_ecdsa"
    ensure_key(job_key)  # not in this (older) TPU's authorized keys
    r = runner(pod, tmp_path, pod.client_key)
    try:
        assert r.run(replace(pod.hosts[0], key_path=job_key), "echo old tpu").stdout == b"old tpu\n"
    finally:
        r.close()


def test_job_keys_are_derived_alike_by_every_reconciler_with_the_same_key(tmp_path):
    seed = tmp_path / "reconciler"
    ensure_key(seed)
    here, there = JobKeys(tmp_path / "a", seed_key=seed), JobKeys(tmp_path / "b", seed_key=seed)
    assert here.public("alice/x") == there.public("alice/x") != here.public("alice/y")
    other = tmp_path / "other"
    ensure_key(other)
    assert JobKeys(tmp_path / "c", seed_key=other).public("alice/x") != here.public("alice/x")
    assert there.existing("bob/new") is not None  # derived on demand, for a peer taking a job over
    key = derive_job_key(seed.read_bytes(), "alice/x")
    assert isinstance(key, paramiko.ECDSAKey) and here.public("alice/x").split()[1] == key.get_base64()


def test_a_forgotten_job_key_is_gone_and_derived_again_alike(tmp_path):
    seed = tmp_path / "reconciler"
    ensure_key(seed)
    keys = JobKeys(tmp_path / "jobs", seed_key=seed)
    public = keys.public("alice/x")
    keys.public("alice/y")
    assert keys.forget("alice/x") and not keys.path("alice/x").parent.exists()
    assert keys.path("alice/y").is_file()  # another job's key stays
    assert not keys.forget("alice/x")  # nothing left: forgetting again is harmless
    assert keys.public("alice/x") == public  # a peer or `ledger doctor` still reaches the hosts
