"""Scrape-time metrics: gauges computed from what the process already holds, when scraped.

Nothing here replays the ledger: `LedgerFollower` reads only the events appended since the
last scrape (the counters by type, preemption to re-create, the tail's soundness), and
`JobsCollector` reads the fold the service keeps anyway (the reconciler's `state.jobs`, the
dashboard's live state) and the queue summary (`ledger.app.queueview`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ledger import __version__
from ledger.app.observability.metrics import GAUGES, LedgerMetrics
from ledger.events import parse_time
from ledger.fold import JobState
from ledger.placement import held
from ledger.spec.policy import Policy
from ledger.store import Store, open_store
from ledger.verify import Problem, TailCheck

T = TypeVar("T")
log = logging.getLogger("tpu_ledger.metrics")


def gauge(name: str, value: float | None = None, labels: Iterable[str] | None = None) -> GaugeMetricFamily:
    """A gauge family named in metrics.GAUGES (its help and label names from there)."""
    help_text, label_names = GAUGES[name]
    family = GaugeMetricFamily(name, help_text, labels=list(labels if labels is not None else label_names) or None)
    if value is not None:
        family.add_metric([], value)
    return family


class InfoCollector(Collector):
    def __init__(self, component: str) -> None:
        self.component = component

    def collect(self) -> Iterator[Metric]:
        info = gauge("tpu_ledger_build_info")
        info.add_metric([__version__, self.component], 1)
        yield info


class LedgerFollower:
    """One store connection of the metrics and health side of a service (never the loop's),
    following the ledger's head: `refresh()` counts the events appended since the last call
    and checks their chain (verify.TailCheck). Thread-safe: scrapes and /readyz share it."""

    def __init__(self, store_url: str, metrics: LedgerMetrics) -> None:
        self.store_url = store_url
        self.metrics = metrics
        self.lock = threading.Lock()
        self._store: Store | None = None
        self.position: int | None = None  # counted up to (starts at the head first seen)
        self.head = 0
        self.tail = TailCheck()
        self._preempted: dict[str, float] = {}  # job -> when its TPU was preempted (awaiting re-create)

    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.store_url, create=False)
        return self._store

    def refresh(self) -> Problem | None:
        """Read what is new; the tail's problem, if any. Raises what the store raises."""
        with self.lock:
            try:
                store = self.store()
                head = store.head()
                if self.position is None:
                    self.position = head
                elif head > self.position:
                    self._count(store.fold_rows(self.position, head))
                    self.position = head
                self.head = head
                return self.tail.check(store)
            except Exception:
                self._drop()
                raise

    def outbox_lag(self, cursor: str) -> tuple[int, float]:
        """(events, seconds) an outbox cursor is behind the head: how many events it has not
        acknowledged, and the age of the oldest of them (0 when caught up)."""
        with self.lock:
            store = self.store()
            head, position = store.head(), store.get_cursor(cursor)
            if position >= head:
                return 0, 0.0
            oldest = next(iter(store.read_all(position, limit=1)), None)
        age = 0.0 if oldest is None else max(0.0, time.time() - parse_time(oldest.time).timestamp())
        return head - position, age

    def outbox_gauges(self, kind: str, label: str, cursor: str) -> dict[str, Any]:
        """The lag gauges `tpu_ledger_<kind>_lag_events` and `..._lag_seconds` of one outbox
        (the fan-out's topic, a notifier's name) as scrape-time values, labelled `label`."""
        events, seconds = self.outbox_lag(cursor)
        return {f"tpu_ledger_{kind}_lag_events": [((label,), events)],
                f"tpu_ledger_{kind}_lag_seconds": [((label,), seconds)]}

    def _count(self, rows: Iterable[tuple]) -> None:
        events = self.metrics.events
        for _seq, stream, _version, type_, time_, _data in rows:
            events.labels(type_).inc()
            if type_ == "preempted":
                self._preempted.setdefault(stream, parse_time(time_).timestamp())
            elif type_ == "provisioned" and stream in self._preempted:
                self.metrics.recreate.observe(max(0.0, parse_time(time_).timestamp() - self._preempted.pop(stream)))
            elif type_ in ("finished", "failed", "cancelled"):
                self._preempted.pop(stream, None)

    def _drop(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            except Exception as exc:  # a dead connection may fail to close: it is dropped either way
                log.debug("closing the metrics store: %s", exc)
            self._store = None

    def close(self) -> None:
        with self.lock:
            self._drop()


class FollowerCollector(Collector):
    """Refreshes the follower at each scrape: head and soundness gauges (the counters it
    updates are in the registry already)."""

    def __init__(self, follower: LedgerFollower) -> None:
        self.follower = follower

    def collect(self) -> Iterator[Metric]:
        try:
            problem = self.follower.refresh()
        except Exception as exc:  # the store is unreachable: /readyz says so; the scrape still answers
            log.debug("metrics: cannot read the ledger: %s", exc)
            return
        yield gauge("tpu_ledger_ledger_head", self.follower.head)
        yield gauge("tpu_ledger_ledger_sound", 0 if problem is not None else 1)


def teams_by_owner(policy: Policy | None) -> dict[str, str]:
    """Owner (lowercased, without @) -> the first team by name that lists them."""
    found: dict[str, str] = {}
    if policy is None:
        return found
    for team in sorted(policy.teams.members, reverse=True):  # the first by name wins: written last
        for member in policy.teams.members[team]:
            found[member.lower().removeprefix("@")] = team
    return found


def stable_copy(read: Callable[[], list[T]]) -> list[T]:
    """`read()`, a copy of a dict another thread may be changing, taken again if the dict
    changed size meanwhile."""
    for _ in range(5):
        try:
            return read()
        except RuntimeError:  # dictionary changed size during iteration
            continue
    return []


def stable_jobs(jobs: Mapping[str, JobState]) -> list[JobState]:
    """The jobs of a fold another thread may be extending."""
    return stable_copy(lambda: list(jobs.values()))


@dataclass
class JobSources:
    """Where `JobsCollector` reads: the fold's jobs, the policy in force, and the queue
    summary (`queueview.queue_summary`), each a function of the moment; `settled`: how many
    jobs in each state the fold holds apart from `jobs` (the reconciler's shelf: they hold
    no TPU)."""

    jobs: Callable[[], Mapping[str, JobState]]
    policy: Callable[[], Policy | None]
    queue: Callable[[], Mapping[str, Any] | None]
    settled: Callable[[], Mapping[str, int]] = dict


class JobsCollector(Collector):
    def __init__(self, sources: JobSources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        jobs = stable_jobs(self.sources.jobs())
        settled = self.sources.settled()
        by_state: dict[str, int] = dict(stable_copy(lambda: list(settled.items())))
        chips: dict[tuple[str, str, str], int] = {}
        refused = 0  # TPUs the API refuses for good to delete: they bill until an admin acts
        teams = teams_by_owner(self.sources.policy())
        for job in jobs:
            state = job.state or "new"
            by_state[state] = by_state.get(state, 0) + 1
            if job.tpu is not None and (job.last_error or {}).get("kind") == "release":
                refused += 1
            if job.tpu is None or job.tpu.get("shared"):  # a shared TPU is the lab's, not the job's
                continue
            took = held(job.tpu)
            if took is None:
                continue
            key = (job.owner, teams.get(job.owner.lower(), ""), took.family)
            chips[key] = chips.get(key, 0) + took.chips
        states = gauge("tpu_ledger_jobs")
        for state, n in sorted(by_state.items()):
            states.add_metric([state], n)
        yield states
        held_ = gauge("tpu_ledger_chips_held")
        for labels, n in sorted(chips.items()):
            held_.add_metric(list(labels), n)
        yield held_
        yield gauge("tpu_ledger_release_refused", refused)
        try:
            summary = self.sources.queue()
        except Exception as exc:  # the fold moved under the queue's reading: next scrape
            log.debug("metrics: queue summary skipped: %s", exc)
            summary = None
        if summary is not None:
            yield gauge("tpu_ledger_jobs_waiting", summary["waiting"])
            yield gauge("tpu_ledger_oldest_wait_seconds", summary["oldest_wait_s"] or 0.0)


class ValuesCollector(Collector):
    """Gauges from a function of the moment: {name: value or [(labels, value)]}; a value of
    None leaves the gauge out (nothing known yet)."""

    def __init__(self, read: Callable[[], Mapping[str, Any]], counters: Mapping[str, str] | None = None) -> None:
        self.read = read
        self.counters = counters or {}  # name -> help: these are counters, not gauges

    def collect(self) -> Iterator[Metric]:
        try:
            values = self.read()
        except Exception as exc:
            log.debug("metrics: %s", exc)
            return
        for name, value in values.items():
            if value is None:
                continue
            if name in self.counters:
                family: Metric = CounterMetricFamily(name, self.counters[name], value=value)
                yield family
                continue
            if isinstance(value, list):
                family = gauge(name)
                for labels, v in value:
                    family.add_metric(list(labels), v)
                yield family
            else:
                yield gauge(name, value)

