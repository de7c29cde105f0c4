"""The waiting jobs as admission sees them, for `ledger queue`, `ledger inspect` and `ledger plan`.

One read model: the ledger's state (snapshot + tail), recent usage from the usage fold
(fair share and weekly quotas, only when the policy asks for them), and the planner's own
pure admission (`reconciler.admission.explain`), so the explanation is the decision.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ledger.app.optiontypes import FC
from ledger.capacity import CapacityMemory
from ledger.capacity_snapshot import capacity_due, load_capacity, save_capacity
from ledger.defaults import USAGE_HALF_LIFE_HOURS
from ledger.errors import ConflictError, LedgerError
from ledger.events import Event, NewEvent, actor, format_time, parse_time
from ledger.events.data import PolicyApplied
from ledger.fold import JobState, evolve, initial
from ledger.replay import load_lazy
from ledger.spec.model import spec_hash
from ledger.spec.policy import Policy, load_policy, sharing_blocks, sharing_policy
from ledger.store import Reader, SnapshotReader, Store, open_store, store_errors
from ledger.usage import POLICY_STREAM, UsageFold, to_us
from ledger.usage.fairtree import fair_tree
from ledger.usage.share import ShareMeter
from ledger.usage.snapshot import (
    load_for_admission,
    load_usage,
    maybe_save_usage,
    save_usage,
    usage_due,
)
from reconciler import admission, placement

log = logging.getLogger("tpu_ledger.policy")


def policy_option(func: FC) -> FC:
    """`--policy PATH`: the jobs repo's .ledger/policy.yaml that the reconciler enforces."""
    return click.option(
        "--policy", "policy_path", envvar="LEDGER_POLICY", default=None, metavar="PATH",
        type=click.Path(path_type=Path),
        help="The jobs repo's .ledger/policy.yaml: quotas, priority classes, fair share [env: LEDGER_POLICY; "
             "unset: the reconciler's, as recorded in the ledger when it started].",
    )(func)


def policy_at(path: Path | None, store: Reader | None = None) -> Policy | None:
    """The policy of the file at `path`; without one, the one the reconciler recorded."""
    if path:
        return load_policy(path)
    return recorded_policy(store) if store is not None else None


def _rules(event: Event) -> dict[str, Any] | None:
    """The sharing rules an event of the `_policy` stream sets: the watcher's (the file in
    git, `policy_changed`) or a reconciler's (its --policy file, `policy_applied`)."""
    if event.type == "policy_applied":
        return event.data.get("blocks")
    if event.type == "policy_changed":
        return event.data.get("sharing")  # absent in events written before sharing was recorded
    return None


def last_rules(store: Reader) -> dict[str, Any] | None:
    """The sharing rules last recorded on the `_policy` stream (None: none ever were)."""
    for event in reversed(list(store.read_stream(POLICY_STREAM))):
        rules = _rules(event)
        if rules is not None:
            return rules
    return None


def recorded_policy(store: Reader) -> Policy | None:
    """The sharing policy in force by the ledger (None: never recorded)."""
    rules = last_rules(store)
    return None if rules is None else sharing_policy(rules)


def record_policy(store: Store, policy: Policy | None, *, source: str, holder: str) -> bool:
    """Record the sharing policy a reconciler enforces from a file, when it differs from the
    rules last recorded (by the watcher or a reconciler); a reconciler without one records
    that nothing is enforced, once something was."""
    for _ in range(3):  # the watcher may append to the stream meanwhile: look again
        version = store.stream_version(POLICY_STREAM)
        rules = last_rules(store) if version else None
        if policy is None and rules is None:
            return False
        blocks = sharing_blocks(policy or Policy())
        digest = spec_hash(blocks)  # SHA-256 of the canonical JSON
        if rules is not None and spec_hash(rules) == digest:
            return False
        data = PolicyApplied(digest=digest, blocks=blocks, source=source, holder=holder)
        try:
            store.append(POLICY_STREAM, [NewEvent("policy_applied", data, actor("reconciler", holder))],
                         expected_version=version)
            return True
        except ConflictError:
            continue
    return False


def half_life_of(store: Reader) -> float:
    """The half-life whose usage snapshot the commands keep: the recorded sharing policy's."""
    policy = recorded_policy(store)
    return policy.fair_share.half_life_hours if policy is not None else USAGE_HALF_LIFE_HOURS


def refresh_usage_snapshot(store: Store) -> bool:
    """Save a usage snapshot at the head when one is due (`ledger replay`, `ledger usage`, as
    the job-state snapshot): snapshot + tail, so at most SNAPSHOT_EVERY events are folded
    unless none was usable. Whether it saved."""
    half_life = half_life_of(store)
    if not usage_due(store, half_life, store.head()):
        return False
    meter, fold = load_usage(store, half_life)
    save_usage(store, meter, fold, now=to_us(datetime.now(UTC)))
    return True


def recent_usage(store: SnapshotReader, policy: Policy | None, now: datetime | None = None) -> admission.Usage:
    """Fair-share and weekly figures at `now` from the whole ledger (as the reconciler has them)."""
    if not admission.active(policy):
        return admission.NO_USAGE
    assert policy is not None
    us = to_us(now or datetime.now(UTC))
    # The live jobs' part suffices; without a usable one (after an upgrade of the usage
    # snapshot's code), the whole fold is made from the first event: saved for the next reader.
    meter, fold = load_for_admission(store, policy.fair_share.half_life_hours,
                                     keep_whole=lambda meter, fold: _keep_usage(store, meter, fold, us))
    return admission.usage_at(meter, fold.open_intervals(us, held=True), us)


def _keep_usage(store: SnapshotReader, meter: ShareMeter, fold: UsageFold, now_us: int) -> None:
    """Save a usage snapshot of a whole fold a reader made, when one is due; a read-only
    ledger still answers (as `ledger usage` does)."""
    with contextlib.suppress(LedgerError), store_errors():
        maybe_save_usage(store, meter, fold, now=now_us)


def refresh_capacity_snapshot(store: SnapshotReader) -> bool:
    """Save a capacity snapshot at the head when one is due (`ledger replay`, as the usage
    snapshot); whether it saved."""
    if not capacity_due(store, store.head()):
        return False
    save_capacity(store, load_capacity(store))
    return True


def capacity_memory(store: SnapshotReader) -> CapacityMemory:
    """The capacity memory at the head for a reader (`ledger queue`, `inspect`). One it had
    to fold far past every usable snapshot (after an upgrade of the memory's code, none is)
    is saved for the next reader, as `recent_usage` keeps a whole usage fold: at 1M events
    every `ledger queue` folded the whole ledger for it (5.4 s) until a reconciler saved one.
    A read-only ledger still answers."""
    memory = load_capacity(store)
    with contextlib.suppress(LedgerError), store_errors():
        if capacity_due(store, memory.position):
            save_capacity(store, memory)
    return memory


def admission_jobs(store: SnapshotReader) -> dict[str, JobState]:
    """The jobs admission reads, at the head: those not ended or still holding a TPU, decoded
    from the snapshot one by one (LazyState.unended_or_holding). The ended ones change no
    admission (the reconciler itself plans without them: reconciler.live); at 118,956 jobs,
    10,200 of them live, decoding every job took ~0.7 s of `ledger queue` and `inspect`."""
    lazy = load_lazy(store)
    return {job.id: job for job in lazy.jobs(lazy.unended_or_holding())}


def queue_rows(store: SnapshotReader, policy: Policy | None, jobs: Mapping[str, JobState] | None = None,
               usage: admission.Usage | None = None, memory: CapacityMemory | None = None,
               now: datetime | None = None) -> list[dict[str, Any]]:
    """Every waiting job in admission order, with why it waits: `ledger queue --json`, the
    `waiting` of `ledger inspect --json`, the dashboard's /api/queue. `jobs`, `usage` and
    the capacity `memory` default to the ledger's (a reader that keeps them current, the
    dashboard, passes its own). As the planner does, the placement step picks each job's
    choice first (reconciler.placement) and admission charges that choice; each row says
    which (`choice`) and why (`placement`)."""
    if jobs is None:
        jobs = admission_jobs(store)
    memory = capacity_memory(store) if memory is None else memory
    placing = placement.place_waiting(jobs, memory, to_us(now or datetime.now(UTC)))
    asks = {jid: got.choice for jid, got in placing.items() if isinstance(got, placement.Try)}
    rows = admission.explain(jobs, policy, recent_usage(store, policy, now) if usage is None else usage, asks=asks)
    for row in rows:
        got = placing.get(row["job"])
        row["choice"], row["placement"] = None, ""
        if isinstance(got, placement.Try):
            row["choice"], row["placement"] = got.choice.index, got.reason
        elif isinstance(got, placement.Hold):
            row["placement"] = got.detail or got.reason
            if row["wait"] in ("admitted", "cloud"):  # the cloud's capacity is why it waits
                row["wait"], row["reason"] = "cloud", f"{placement.HOLD}: {got.detail}" if got.detail else got.reason
    return rows


def share_rows(policy: Policy | None, jobs: Mapping[str, JobState], usage: admission.Usage) -> list[dict[str, Any]]:
    """The fair tree as admission orders by it: the lab, then each team and its users in rank
    order, each with its weight, its share among its siblings, its decayed usage (chip-hours)
    and that usage's share, and share / usage (None: no usage yet). `ledger queue --tree`,
    the dashboard's Queue page. Empty without a sharing policy."""
    if policy is None or not admission.active(policy):
        return []
    owners = {j.owner for j in jobs.values() if not j.terminal}
    return [level.to_json() for level in fair_tree(policy, usage.decayed, owners).levels]


def queue_summary(rows: list[dict[str, Any]], now: datetime | None = None) -> dict[str, Any]:
    """What metrics want of the queue (`queue_rows`): waiting jobs by what they wait for, and
    the oldest wait in seconds (None: nobody waits). Jobs admitted at the next pass count as
    waiting until their TPU is asked for."""
    by_wait: dict[str, int] = {}
    for r in rows:
        by_wait[r["wait"]] = by_wait.get(r["wait"], 0) + 1
    oldest = min((r["since"] for r in rows if r.get("since")), default=None)
    return {"waiting": len(rows), "by_wait": by_wait, "oldest_since": oldest, "oldest_wait_s": _waited(oldest, now)}


def _waited(since: str | None, now: datetime | None) -> float | None:
    """Seconds from `since` to `now` (None: nobody waits)."""
    return None if since is None else max(0.0, ((now or datetime.now(UTC)) - parse_time(since)).total_seconds())


def waiting_summary(jobs: Iterable[JobState], now: datetime | None = None) -> dict[str, Any]:
    """How many jobs wait for a TPU and since when the longest has waited, straight from the
    fold (admission.waiting_jobs): the metrics' cheap reading of the queue, with no admission
    pass (`queue_summary` of `queue_rows` says the same with the reasons)."""
    count, oldest = 0, None
    for job in admission.waiting_jobs(jobs):
        count += 1
        since = admission.waiting_since(job)
        if since and (oldest is None or since < oldest):
            oldest = since
    return {"waiting": count, "oldest_since": oldest, "oldest_wait_s": _waited(oldest, now)}


class _Stream:
    """The `_policy` stream seen from one store per thread (the loop's thread asks every pass)."""

    def __init__(self, store_url: str) -> None:
        self.store_url = store_url
        self.local = threading.local()

    def store(self) -> Store:
        store = getattr(self.local, "store", None)
        if store is None:
            store = self.local.store = open_store(self.store_url)
        return store


class LedgerPolicy(_Stream):
    """The sharing policy a reconciler without --policy follows: the rules the watcher
    recorded from the policy file on the branch (read again only when the stream moves)."""

    def __init__(self, store_url: str) -> None:
        super().__init__(store_url)
        self.version = -1
        self.policy: Policy | None = None

    def __call__(self) -> Policy | None:
        store = self.store()
        version = store.stream_version(POLICY_STREAM)
        if version != self.version:
            self.version = version
            self.policy = recorded_policy(store)
        return self.policy


class PolicyFile(_Stream):
    """The policy file a reconciler follows (--policy): read again when it changes (its mtime
    or size), its rules recorded in the ledger whenever they differ from the last recorded
    (the watcher's, from git, included). A broken edit is logged and the last good policy
    kept: a typo never lifts every quota."""

    def __init__(self, path: Path, store_url: str, holder: str) -> None:
        super().__init__(store_url)
        self.path, self.holder = Path(path), holder
        self.key: tuple[int, int] | None = None
        self.policy: Policy | None = None
        self.version = -1

    def __call__(self) -> Policy | None:
        changed = self._reload()
        store = self.store()
        if changed or store.stream_version(POLICY_STREAM) != self.version:
            record_policy(store, self.policy, source=str(self.path), holder=self.holder)
            self.version = store.stream_version(POLICY_STREAM)
        return self.policy

    def _reload(self) -> bool:
        """Whether the file changed into another good policy (now `self.policy`). A file
        caught mid-write is not read as a policy: empty (an editor or `>` truncates it
        first; read so, it was a policy without a single quota, applied and recorded for a
        pass), or, once a policy is in force, changed while it was read (read again at the
        next call)."""
        key = self._key()
        if key is None or key == self.key:
            return False
        if key[1] == 0 and self.policy is not None:
            self.key = key
            log.warning("policy %s is empty; keeping the last one read (to lift every rule, write {})", self.path)
            return False
        try:
            policy = load_policy(self.path)
        except LedgerError as exc:
            if self.policy is None:
                raise  # at start: refuse to run with a broken policy
            self.key = key
            log.warning("policy %s not applied: %s; keeping the last good one", self.path, exc)
            return False
        if self.policy is not None and self._key() != key:
            return False  # rewritten while read: the next call reads what it became
        self.key = key
        self.policy = policy
        return True

    def _key(self) -> tuple[int, int] | None:
        """The file's (mtime, size); None when it cannot be read and a policy is in force."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if self.policy is None:
                raise LedgerError(f"cannot read policy {self.path}: {exc.strerror}", hint="pass --policy PATH") from exc
            log.warning("policy %s: %s; keeping the last one read", self.path, exc.strerror)
            return None
        return st.st_mtime_ns, st.st_size


def would_start(store: Reader | None) -> Callable[[Mapping[str, dict[str, Any]], Policy], Mapping[str, str]] | None:
    """For `ledger plan`: whether each new job would start now or wait, and why, were it
    submitted now beside the ledger's jobs (None without a ledger: nobody can tell)."""
    if store is None:
        return None

    def answer(new: Mapping[str, dict[str, Any]], policy: Policy) -> Mapping[str, str]:
        position = store.head()  # the new jobs' submissions come after every event admission_jobs reads
        jobs = admission_jobs(store)  # as `ledger queue`: the ended jobs change no admission
        when = format_time(datetime.now(UTC))
        for i, (job_id, spec) in enumerate(sorted(new.items()), start=1):
            old = jobs.get(job_id)
            if old is not None and not old.terminal:
                continue  # a live job of that id: the change is an update, not a new place in line
            jobs[job_id] = evolve(initial(job_id), "submitted", {"spec": spec, "spec_hash": "0" * 8, "commit": "plan"},
                                  time=when, seq=position + i)
        rows = {r["job"]: r for r in admission.explain(jobs, policy, recent_usage(store, policy))}
        out = {}
        for job_id in new:
            row = rows.get(job_id)
            if row is None:
                continue
            if row["wait"] == "admitted":
                out[job_id] = "would start now"
            else:
                out[job_id] = f"would wait (#{row['position']} in the queue): {row['reason']}"
        return out

    return answer
