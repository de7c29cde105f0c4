"""Every metric tpu-ledger exports, defined here and nowhere else (docs/metrics.md lists them).

Names follow Prometheus's conventions: `tpu_ledger_` first, the unit last (`_seconds`,
`_chips`), counters end in `_total`, durations are histograms. A process registers only the
groups that describe it, so a watcher never exports a reconciler's pass time (an alert on a
missing pass would then fire for it):

- `LedgerMetrics`: what any process that follows the ledger says of it (events appended by
  type, the tail's soundness, the readiness checks). Every service.
- jobs by state, chips held, the queue (`GAUGES`): scrape-time gauges over the fold the
  process already holds (the reconciler's, the dashboard's), never a replay per scrape.
- `ReconcilerMetrics`: passes, the TPU API, SSH (orphans and leases are gauges).
- the watcher's, the fan-out's and the dashboard's own gauges: in `GAUGES` and `COUNTERS`.

Counters and histograms are updated where things happen (hooks: `TpuApi.observers`,
`SSHPool.observers`, `Reconciler.pass_observers`); gauges that are a function of state are
computed at scrape time by the collectors in `collectors.py`, named from `GAUGES` below.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

PREFIX = "tpu_ledger_"

# Scrape-time gauges (collectors.py builds them from state): name -> (help, labels).
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "tpu_ledger_build_info": ("The running version and component (always 1).", ("version", "component")),
    "tpu_ledger_jobs": ("Jobs by state, from the process's fold of the ledger.", ("state",)),
    "tpu_ledger_chips_held": ("TPU chips held by running and recovering jobs, by owner, team and accelerator family.",
                              ("owner", "team", "family")),
    "tpu_ledger_jobs_waiting": ("Jobs waiting for a TPU (admission, quota or the cloud's capacity).", ()),
    "tpu_ledger_oldest_wait_seconds": ("How long the longest-waiting job has waited (0 when none waits).", ()),
    "tpu_ledger_ledger_head": ("The ledger's head (the seq of its newest event) as this process last read it.", ()),
    "tpu_ledger_ledger_sound": ("1 while the ledger checks out (the tail's chain here; the dashboard: the last full "
                                "verify), 0 once a problem was found.", ()),
    "tpu_ledger_ready": ("1 when a /readyz check passes, 0 when it fails, by check.", ("check",)),
    "tpu_ledger_lease_holder": ("1 while this reconciler holds its member lease (0: it lost it), by holder.",
                                ("holder",)),
    "tpu_ledger_leases_held": ("Job leases this reconciler holds.", ()),
    "tpu_ledger_release_refused": ("TPUs whose delete the TPU API refused for good (the job names the permission to "
                                   "grant): they keep billing until an admin acts.", ()),
    "tpu_ledger_orphaned_tpus": ("Managed TPUs no live job holds, past the grace period, at the last pass.", ()),
    "tpu_ledger_reconcile_last_success_timestamp_seconds": ("When the last reconcile pass completed (Unix time).", ()),
    "tpu_ledger_watcher_last_success_timestamp_seconds": ("When the watcher last read the branch and was up to date "
                                                          "(Unix time).", ()),
    "tpu_ledger_watcher_lag_seconds": ("Seconds since the watcher last caught up with the branch.", ()),
    "tpu_ledger_fanout_lag_events": ("Events appended but not yet acknowledged by Pub/Sub (head minus the cursor).",
                                     ("topic",)),
    "tpu_ledger_fanout_lag_seconds": ("Age of the oldest event not yet published (0 when caught up).", ("topic",)),
    "tpu_ledger_notify_lag_events": ("Events a notifier has not yet gone through (head minus its cursor).",
                                     ("notifier",)),
    "tpu_ledger_notify_lag_seconds": ("Age of the oldest event a notifier has not yet gone through (0 when caught up).",
                                      ("notifier",)),
    "tpu_ledger_verify_ok": ("1 when the dashboard's last full verify found the ledger sound, 0 when it found a "
                             "problem or could not run.", ()),
    "tpu_ledger_verify_last_run_timestamp_seconds": ("When the dashboard's last full verify ended (Unix time).", ()),
}

# Scrape-time counters (a count the service keeps itself): name (without _total) -> help.
COUNTERS: dict[str, str] = {
    "tpu_ledger_watcher_errors": "Ingests that failed (git or the store unreachable) and were retried with backoff.",
}

PASS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
API_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RECREATE_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0)
SNAPSHOT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class LedgerMetrics:
    """Every service: the events the ledger gained, by type (read from the tail at scrape time)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Counter("tpu_ledger_events_appended", "Events appended to the ledger since this process started "
                              "following it, by type (any writer: take max() across instances, not sum()).",
                              ["type"], registry=registry)
        self.recreate = Histogram("tpu_ledger_preemption_recreate_seconds",
                                  "From a job's `preempted` event to its next `provisioned` (the TPU re-created).",
                                  buckets=RECREATE_BUCKETS, registry=registry)


class ReconcilerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.pass_seconds = Histogram("tpu_ledger_reconcile_pass_duration_seconds",
                                      "Duration of one reconcile pass (catch up, observe, plan, dispatch).",
                                      buckets=PASS_BUCKETS, registry=registry)
        self.api_calls = Counter("tpu_ledger_tpu_api_calls", "Calls to the Cloud TPU API, by method and status code.",
                                 ["method", "code"], registry=registry)
        self.api_errors = Counter("tpu_ledger_tpu_api_errors", "Calls to the Cloud TPU API that failed, by method and code.",
                                  ["method", "code"], registry=registry)
        self.api_seconds = Histogram("tpu_ledger_tpu_api_call_duration_seconds", "Duration of Cloud TPU API calls.",
                                     ["method"], buckets=API_BUCKETS, registry=registry)
        self.ssh_errors = Counter("tpu_ledger_ssh_errors", "SSH commands to TPU hosts that failed, by kind "
                                  "(HostUnreachable, ChannelLost, AuthFailed, HostKeyMismatch, CommandTimeout, ...).",
                                  ["kind"], registry=registry)
        self.snapshot_seconds = Histogram("tpu_ledger_snapshot_save_duration_seconds",
                                          "Encoding and saving the reconciler's snapshots (jobs' states, usage; every 10,000 events, "
                                          "beside the passes).",
                                          buckets=SNAPSHOT_BUCKETS, registry=registry)
        self.snapshot_failures = Counter("tpu_ledger_snapshot_save_failures", "Saves of the reconciler's snapshots that failed "
                                         "(the store refused or was unreachable): each restart then replays more events.",
                                         registry=registry)

    def snapshot_saved(self, seconds: float, ok: bool) -> None:
        """`Reconciler.snapshot_observers` hook."""
        if ok:
            self.snapshot_seconds.observe(seconds)
        else:
            self.snapshot_failures.inc()

    def api_call(self, method: str, code: str, seconds: float) -> None:
        """`TpuApi.observers` hook: one call of `method` ended with `code` after `seconds`."""
        self.api_calls.labels(method, code).inc()
        if code != "OK":
            self.api_errors.labels(method, code).inc()
        self.api_seconds.labels(method).observe(seconds)

    def ssh_event(self, event: str, _host: str, detail: str) -> None:
        """`SSHPool.observers` hook: a command that failed, by its error's class (a connection
        that dropped and was reopened for the command is not a failure)."""
        if event == "command_failed":
            self.ssh_errors.labels(detail).inc()


