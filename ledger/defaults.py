"""Defaults shared by every process, each defined once: where things live, what they are called.

Every setting is also a CLI option with an environment variable beside it; these are the
values used when neither is given (the README's configuration table lists them).
"""

from __future__ import annotations

import os
from pathlib import Path

# Where a user's ledger, logs and keys live: $XDG_DATA_HOME/tpu-ledger.
DATA_HOME = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share") / "tpu-ledger"
STORE_PATH = DATA_HOME / "ledger.db"


def store_url() -> str:
    """The ledger when --store is not given: $LEDGER_STORE, else the embedded file."""
    return os.environ.get("LEDGER_STORE") or f"sqlite:///{STORE_PATH}"


LOG_DIR = DATA_HOME / "logs"
# Where reconcilers collect every attempt's logs (reconciler.joblogs): a directory they share,
# or gs://bucket/prefix; bounded per log file and per job.
LOG_ARCHIVE = DATA_HOME / "job-logs"
LOG_MAX_FILE_MIB = 64
LOG_MAX_JOB_MIB = 1024
LOG_COLLECT_EVERY_S = 2.0
SSH_KEY = DATA_HOME / "ssh" / "id_ecdsa"
SSH_USER = "ledger"


def ssh_key() -> Path:
    """The reconciler's own private key: $LEDGER_SSH_KEY, else SSH_KEY. It never leaves the
    reconciler: a job spec naming it is refused (ledger.spec.secrets)."""
    return Path(os.environ.get("LEDGER_SSH_KEY") or SSH_KEY).expanduser()


# Files a job spec names (SSH identities, conda and requirements files) come from here only,
# from the job owner's own folder: <dir>/<owner>/<name>, written `secret://<name>` or `<name>`.
SECRETS_DIR = DATA_HOME / "secrets"


def secrets_dir() -> Path:
    """$LEDGER_SECRETS_DIR, else SECRETS_DIR (read at call time: tests and admins set it)."""
    return Path(os.environ.get("LEDGER_SECRETS_DIR") or SECRETS_DIR).expanduser()


# Per-job SSH keys (reconciler/keys.py) live under the data dir, never in the ledger.
JOB_KEYS_DIR = DATA_HOME / "ssh" / "jobs"

# The Google Cloud project when none is configured: the emulator's, so nothing reaches Google.
PROJECT = "tpu-ledger-local"

# A managed TPU that no live job holds is deleted after this long (a node created moments ago
# may belong to an intent whose outcome is not recorded yet).
ORPHAN_GRACE_S = 300.0

# How long a TPU delete is awaited, and how often a deletion under way is looked at. Google
# Cloud takes minutes to delete a TPU VM; a release is recorded only once it has, so a failed
# delete can never leave the TPU live beside the job's next one.
TPU_DELETE_WAIT_S = 900.0
TPU_DELETE_POLL_S = 1.0

# A worker the SSH probe finds gone (or killed by a signal) while the TPU API still reads the
# node READY and healthy: the API is asked again for this long before the loss is recorded as
# `lost_host`, because Google may flip the node to PREEMPTED a little after its VMs die.
LOST_HOST_CONFIRM_S = 5.0

# After a failed ingest (git or the store unreachable) the watcher waits interval * 2^n
# seconds, at most this long, before it tries again; file system hints do not cut it short.
WATCH_MAX_BACKOFF_S = 300.0

# Checkpoint reporting (a job spec's `job.checkpoints`): a job prints a line matching the
# pattern, whose one group is the step; the reconciler records at most one `checkpointed`
# event per job per interval, and only for a newer step.
CHECKPOINT_PATTERN = r"LEDGER_CHECKPOINT step=(\d+)"
CHECKPOINT_EVERY_S = 60.0

# Host hygiene (`ledger doctor`, and the checks before every start): where a TPU VM keeps
# what the checks look at, relative to HOST_ROOT ("" on a real VM; "~/.vm" in the emulator's
# sandboxes, where `--tpu-endpoint` points at it), and the free disk a start needs.
HOST_ROOT = ""
EMULATOR_HOST_ROOT = "~/.vm"
DOCTOR_MIN_FREE_BYTES = 1 << 30

# The fair-share half-life (hours) of the usage snapshot `ledger usage` saves when no sharing
# policy is recorded (its accounts are the same whatever the half-life; only the meter differs).
USAGE_HALF_LIFE_HOURS = 168.0

# Placement (docs/placement.md): a job moves on to its next choice after this many stockouts
# of the one it tries (`tpu.failover.stockouts`), and a queued-resource choice with choices
# after it waits at most this long in WAITING_FOR_RESOURCES (`tpu.failover.wait_s`).
FAILOVER_STOCKOUTS = 1
QUEUED_WAIT_S = 3600.0
# The lab-wide capacity memory: after n stockouts in a row of one (zone, type, pricing), the
# next create there is tried after min(base * 2^(n-1), max) seconds, by one job.
CAPACITY_BACKOFF_S = 10.0
CAPACITY_BACKOFF_MAX_S = 300.0
# Multislice: the port of the Megascale coordinator (worker 0 of slice 0) when the host does
# not set MEGASCALE_PORT itself.
MEGASCALE_PORT = 8081

# Redaction of the secrets a job received from its collected output (ledger.spec.redact):
# lines of a secret shorter than this are not looked for (a 3-letter line would mask every
# occurrence of that word); a secret file of one short line is masked whole all the same.
REDACT_MIN_CHARS = 8

# The forge (ledger.forge): a webhook delivery older than this (its `Date`, or the push's
# own timestamp) is refused as stale; delivery ids are remembered this long to refuse replays.
WEBHOOK_MAX_AGE_S = 300.0
# How many pull requests' reviews a forge adapter keeps (keyed by number and head commit).
FORGE_CACHE_SIZE = 1024

# The Cloud TPU API: every call has a deadline (the client library sets none, so a hung
# endpoint would hang the loop), and a zone whose API fails is tried again after a capped,
# jittered exponential backoff (google.api_core.retry.exponential_sleep_generator): the first
# retry within TPU_BACKOFF_INITIAL_S, then doubling up to TPU_BACKOFF_MAX_S (`reconcile
# --api-backoff-max`). The cap bounds how long work waits once an API that answered errors
# (rather than vanishing: the channel's reconnect says so at once) is back, so it is short: a
# list call per zone every few seconds is nothing against the API's read quota. A zone failing
# for TPU_DOWN_AFTER_S is recorded unreachable (one `api_unreachable` event on `_cloud`), and
# reachable again when a call succeeds; a blip shorter than that records nothing.
TPU_CALL_TIMEOUT_S = 20.0
TPU_BACKOFF_INITIAL_S = 1.0
TPU_BACKOFF_MAX_S = 4.0
TPU_DOWN_AFTER_S = 5.0
# The gRPC channel reconnects on its own within this (grpc.max_reconnect_backoff_ms), and the
# loop tries the zones at once when it does: work resumes within seconds of the API's return.
TPU_RECONNECT_MAX_S = 2.0
# An action the API refused in a way no planning step answers (a delete denied, say) is
# tried again after a jittered backoff capped at this, not at every pass.
TPU_ACTION_BACKOFF_MAX_S = 60.0
# A release (delete) the TPU API refused for good (e.g. PERMISSION_DENIED on tpu.nodes.delete)
# is tried again this often, not at the action backoff's pace: each try records its intent and
# outcome, and the fix (an admin granting the permission) takes people, not seconds.
RELEASE_REFUSED_RETRY_S = 600.0
# The reconciler's fair-share and weekly-quota figures are made again when the usage fold
# moved, the policy's meter changed, or this long passed (they drift only with the clock).
FAIR_SHARE_REFRESH_S = 10.0
# The stream of facts about the cloud rather than one job (job folds skip `_` streams).
CLOUD_STREAM = "_cloud"

# Operating the services (ledger/app/observability): every long-running command writes a
# heartbeat to the store this often; `ledger status` and the dashboard call an instance dead
# when its last beat is older than HEARTBEAT_DEAD_S, and rows silent for HEARTBEAT_FORGET_S
# are dropped when a service starts.
HEARTBEAT_EVERY_S = 5.0
HEARTBEAT_DEAD_S = 30.0
HEARTBEAT_FORGET_S = 7 * 24 * 3600.0
# /readyz: a reconciler is ready while its last complete pass is at most this many intervals
# old (and at least READY_PASS_MIN_S: a pass that observes many zones and hosts takes time);
# a watcher while its last successful poll is at most this many intervals old.
READY_PASS_INTERVALS = 10
READY_PASS_MIN_S = 60.0
# SSH to TPU hosts (reconciler/remote/ssh.py): one persistent connection per host. paramiko
# sends a keepalive message this often; the kernel gives up on a peer that stopped answering
# after the TCP settings below (a vanished VM fails its connection, and wakes the loop).
SSH_KEEPALIVE_S = 15
SSH_TCP_KEEPIDLE_S = 15
SSH_TCP_KEEPINTVL_S = 5
SSH_TCP_KEEPCNT = 3
SSH_TCP_USER_TIMEOUT_S = 30.0
# A connection no job used for this long (and carrying no watcher) is closed; past this many
# connections the least recently used idle ones are.
SSH_IDLE_CLOSE_S = 900.0
SSH_POOL_MAX = 4096
