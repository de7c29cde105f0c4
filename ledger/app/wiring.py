"""Builds a Reconciler from configuration: the one place that knows every adapter."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger import defaults
from ledger.fold import JobState
from ledger.spec.policy import Policy
from reconciler.doctor import Doctor, Gate, Paths
from reconciler.keys import JobKeys, ensure_key
from reconciler.loop import Reconciler
from reconciler.model import PlanConfig
from reconciler.remote import Host, RemoteRunner
from reconciler.tpu import TpuApi


@dataclass
class Settings:
    store_url: str
    project: str = defaults.PROJECT
    tpu_endpoint: str | None = None
    ssh_key: Path = defaults.SSH_KEY
    secrets_dir: Path | None = None  # None = defaults.secrets_dir() ($LEDGER_SECRETS_DIR)
    job_keys_dir: Path | None = None  # None = a `jobs/` folder beside ssh_key
    ssh_user: str = defaults.SSH_USER
    log_dir: Path = defaults.LOG_DIR
    holder: str = socket.gethostname()
    interval: float = 2.0
    orphan_grace_s: float = defaults.ORPHAN_GRACE_S
    intent_timeout_s: float = 600.0
    queued_retry_s: float = 10.0
    release_refused_retry_s: float = defaults.RELEASE_REFUSED_RETRY_S
    lease_ttl_s: float = 15.0  # 0 = no leases: one reconciler acts on every job
    api_backoff_max_s: float = defaults.TPU_BACKOFF_MAX_S  # a failing zone's API is tried at least this often
    policy: Policy | None = None  # quotas, priority classes, fair share: None = admit every job
    host_root: str | None = None  # the VMs' root for the host checks; None: the emulator's with tpu_endpoint
    host_checks: bool = True  # check (and safely repair) the hosts before every start


def host_paths(settings: Settings) -> Paths:
    """Where the host checks look: a real VM's paths, or the emulator's sandbox (`~/.vm`)."""
    root = settings.host_root
    if root is None:
        root = defaults.EMULATOR_HOST_ROOT if settings.tpu_endpoint else defaults.HOST_ROOT
    return Paths.for_root(root)


def hosts_of(username: str, job_keys: JobKeys | None = None) -> Callable[[JobState], list[Any]]:
    def convert(job: JobState) -> list[Any]:
        # A TPU the reconciler created for the job accepts the job's own key only; a shared
        # TPU (set up by an admin) keeps the reconciler's.
        own = job_keys.existing(job.id) if job_keys is not None and not (job.tpu or {}).get("shared") else None
        # Every slice's hosts, slice by slice: a host's rank is its place in that list (its
        # worker id for a one-slice job), which keys what the runner reports.
        return [
            Host(worker=h["worker"], address=h["address"], port=h.get("port", 22), username=username,
                 host_key=h.get("host_key"), key_path=own, slice=h.get("slice", 0), rank=i)
            for i, h in enumerate(job.hosts)
        ]

    return convert


def extra_args_of(spec: dict) -> list[str]:
    """Config overrides as flags; the validator expanded aliases when it normalised the spec."""
    command = spec.get("command") or {}
    flags = command.get("args_flags")
    if flags is not None:
        return list(flags)
    return [f"--{k}={v}" for k, v in sorted((spec.get("args") or {}).items())]


def job_keys_of(settings: Settings) -> JobKeys:
    """The per-job SSH keys: a TPU the reconciler created accepts its job's key only. They are
    derived from the reconciler's key, so a peer reconciler with the same key (or `ledger
    doctor` on another host) reaches the hosts with nothing shared or stored."""
    return JobKeys(settings.job_keys_dir or settings.ssh_key.parent / "jobs", seed_key=settings.ssh_key)


def build(settings: Settings, **overrides: Any) -> Reconciler:
    ensure_key(settings.ssh_key)
    job_keys = job_keys_of(settings)
    runner = RemoteRunner(
        private_key_path=settings.ssh_key,
        known_hosts_path=settings.ssh_key.parent / "known_hosts",
        log_dir=settings.log_dir,
        username=settings.ssh_user,
        secrets_dir=settings.secrets_dir,
    )
    config = PlanConfig(
        holder=settings.holder, orphan_grace_s=settings.orphan_grace_s,
        # With leases a peer's intent is taken over once its lease lapses, never by age.
        intent_timeout_s=settings.intent_timeout_s if settings.lease_ttl_s <= 0 else float("inf"),
        queued_retry_s=settings.queued_retry_s, policy=settings.policy,
        release_refused_retry_s=settings.release_refused_retry_s,
    )
    rec = Reconciler(
        settings.store_url, TpuApi(settings.project, settings.tpu_endpoint), runner,
        holder=settings.holder, ssh_user=settings.ssh_user, ssh_public_key=job_keys.public,
        hosts_of=hosts_of(settings.ssh_user, job_keys), extra_args_of=extra_args_of, forget_job_key=job_keys.forget,
        interval=settings.interval, config=config, lease_ttl=settings.lease_ttl_s, **overrides,
    )
    rec.health.maximum = settings.api_backoff_max_s
    if settings.host_checks:
        rec.executor.doctor = Gate(Doctor(runner, host_paths(settings)), settings.holder)
    return rec
