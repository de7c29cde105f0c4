"""The dashboard's live read model: one per server, kept current from the store's tail.

At start it loads every job's state as `ledger replay` does (the newest usable snapshot plus
the events after it), the settled jobs packed on a shelf as the reconciler keeps them, each
with the card the jobs page lists it by (ledger.shelf: ~0.3 KB a job where a state is ~2.7;
at 118,956 jobs 320 MB of the dashboard's memory was the history's states), the capacity
memory the same way, the TPUs' last host checks from the streams of their holders as
`ledger tpus` reads them, and the usage
fold (`ledger usage`'s, with its weekly table) and the fair-share meter of the recorded
policy's half-life the same way (its usage snapshot plus the events after it; from the first
event when none is usable): at once for a small ledger; past FOLD_BEHIND_FROM events on a
thread of its own while the pages are served (1.5 s from a snapshot at 118,956 jobs, ~7 s
folding 1M events without one), the pages that read usage waiting for it (`wait_for_usage`).
Then one thread waits on the store's append waiter (`wait_for_append`: LISTEN/NOTIFY on
PostgreSQL, a cheap head poll on SQLite), reads only the new rows and folds them into both,
as the reconciler's loop does. No request replays the ledger; every page reads this state
under its lock. Each batch of new events is then announced to the listeners (the server's
Server-Sent Events), once per batch whatever the number of clients.

A second thread runs `ledger verify`'s check over the whole ledger at start and again when
the ledger grew (paced by how long a run takes, at most `verify_every` seconds apart): the
health page and each event's chain status show its last result.

Request handlers that must read the store (a job's events) borrow a connection from a
small pool (`StorePool`): one connection is never used by two threads at once.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ledger.app.queueview import half_life_of
from ledger.app.readmodels import (
    JobCard,
    Listing,
    TpuHealth,
    card_of,
    health_streams,
    tpu_health_of_rows,
)
from ledger.capacity import CapacityMemory
from ledger.capacity_snapshot import load_capacity
from ledger.errors import LedgerError
from ledger.events import format_time
from ledger.fanout import cursor_name
from ledger.fold import JobState, LedgerState
from ledger.replay import fold_into, fold_rows
from ledger.shelf import LiveJobs, PackedJobs
from ledger.snapshots.jobs import InChunk
from ledger.snapshots.plain import no_cyclic_gc
from ledger.spec.policy import Policy
from ledger.store import Store, open_store, store_errors
from ledger.usage import Rollup, UsageFold, to_us
from ledger.usage.fold import Interval
from ledger.usage.share import ShareMeter
from ledger.usage.snapshot import load_usage, usage_start
from ledger.verify import verify_store
from reconciler import admission

log = logging.getLogger("ledger.dashboard")


class VerifyStopped(Exception):
    """The dashboard closed during its verify."""


class UsagePending(LedgerError):
    """Usage is still being folded at start: the page answers 503 and says how far it is."""


RECENT = 2_000  # events kept for clients that reconnect (SSE Last-Event-ID)
BATCH = 5_000  # rows folded per lock hold: pages stay responsive while a backlog is read
CATCH_UP_BATCH = 100_000  # rows usage's catch-up reads a query
WAIT_S = 0.5  # longest wait on the store before looking at the stop flag again
VERIFY_MIN_S = 2.0
VERIFY_RATIO = 20  # verify again no sooner than this many times its last duration
FOLD_BEHIND_FROM = 200_000  # events: usage is folded behind the pages (`_catch_up`) past this many
USAGE_WAIT_S = 20.0  # how long a page that reads usage waits for it at start before a 503


class StorePool:
    """Store connections for request threads, each used by one thread at a time."""

    def __init__(self, url: str, size: int = 4) -> None:
        self.url = url
        self._free: queue.LifoQueue[Store] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._all: list[Store] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def store(self) -> Iterator[Store]:
        with self._slots:
            try:
                store = self._free.get_nowait()
            except queue.Empty:
                store = open_store(self.url, create=False)
                with self._lock:
                    self._all.append(store)
            try:
                with store_errors(self.url):
                    yield store
            except BaseException:
                # A connection that failed mid-read is not handed out again.
                with self._lock:
                    self._all.remove(store)
                with contextlib.suppress(Exception):
                    store.close()
                raise
            self._free.put(store)

    def close(self) -> None:
        with self._lock:
            stores, self._all = self._all, []
        for store in stores:
            with contextlib.suppress(Exception):
                store.close()


@dataclass(frozen=True, slots=True)
class VerifyRun:
    """The result of the dashboard's last check of the whole ledger."""

    started: str  # ISO UTC
    seconds: float
    report: dict[str, Any] | None  # `ledger verify --json`'s ok/events/head/problem
    error: str | None = None  # the check could not run (the store failed)

    @property
    def ok(self) -> bool:
        return self.report is not None and bool(self.report["ok"])

    @property
    def verified_head(self) -> int:
        """Every event up to this seq was in a sound chain at the last check."""
        if self.report is None:
            return 0
        problem = self.report.get("problem")
        return problem["position"] - 1 if problem else int(self.report["head"])

    def to_dict(self) -> dict[str, Any]:
        return {"started": self.started, "seconds": round(self.seconds, 3), "report": self.report, "error": self.error}


class CardedShelf(PackedJobs):
    """The dashboard's settled jobs, packed (their snapshot pieces), each with its card, and
    their listing (`listing`) kept until a job settles or comes back."""

    PUT_READS = None  # its card (card_of) reads most of the job

    def __init__(self) -> None:
        super().__init__()
        self.cards: dict[str, JobCard] = {}
        self._listing: Listing | None = None

    def put(self, job: JobState, where: InChunk | None = None) -> None:
        super().put(job, where)
        self.cards[job.id] = card_of(job)
        self._listing = None

    def take(self, job_id: str) -> JobState | None:
        self.cards.pop(job_id, None)
        self._listing = None
        return super().take(job_id)

    def listing(self) -> Listing:
        """The settled jobs' cards in id order, counted (readmodels.Listing)."""
        if self._listing is None:
            self._listing = Listing.of(self.cards.values())
        return self._listing


class LiveLedger:
    """The state every page reads: jobs, usage, the latest events; updated by the tail."""

    def __init__(self, store_url: str, *, topic: str = "ledger-events", verify_every: float = 600.0,
                 fold_behind_from: int = FOLD_BEHIND_FROM) -> None:
        self.store_url = store_url
        self.topic = topic
        self.verify_every = verify_every
        self.lock = threading.RLock()
        self.meter: ShareMeter | None = None  # fair share for the queue page, loaded with usage
        self.usage = UsageFold(on_interval=self._closed)  # replaced by the one loaded (`_load_usage`)
        self._rollups: dict[str, Rollup] = {}  # the usage page's sums, by grouping: `rollup`
        self.health = TpuHealth()  # each TPU's last host check (`ledger tpus`' health column)
        self.capacity = CapacityMemory()  # past stockouts: where each waiting job will be placed
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.listeners: list[Callable[[], None]] = []
        self.tail_error: str | None = None
        self.last_verify: VerifyRun | None = None
        self.verifying = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pages: dict[str, tuple[Any, Any]] = {}  # page -> (key, answer): `cached`
        self._live_cards: dict[str, tuple[int, JobCard]] = {}  # live job -> (its last event's seq, its card): `listing`
        self._cache_lock = threading.Lock()
        self._store = open_store(store_url, create=False)  # the tail's own connection
        started = time.perf_counter()
        with store_errors(store_url):
            # The settled jobs on the shelf, never all held at once, each with its card.
            self.jobs = LiveJobs(CardedShelf())
            lazy = self.jobs.load(self._store, CardedShelf)
            self.capacity = load_capacity(self._store, self.state.position)
            # The TPUs' holders from the snapshot's index (one made from the states took ~1 s
            # more); their checks up to the jobs' position, the tail's after it.
            self.health = tpu_health_of_rows(self._store.stream_rows(
                health_streams(lazy.holders(), lazy.releasing), TpuHealth.TYPES, self.state.position))
            del lazy
        self.position = self._loaded_at = self.state.position
        self.usage_ready = threading.Event()  # set once usage is folded up to the tail
        self.usage_read = 0  # the seq usage is folded up to while it catches up (its progress)
        self._behind: list[list[tuple]] | None = None  # rows the tail read while usage caught up
        if self.position < fold_behind_from:
            with store_errors(store_url), no_cyclic_gc():
                self._load_usage(self._store, self.position)
                self.usage.apply_rows(fold_rows(self._store, self.usage.position, self.position))
            self.usage_read = self.position
            self.usage_ready.set()
        else:
            self._behind = []
        # The collector's first full pass over what was just loaded (954k containers at
        # 118,956 jobs: ~0.5 s) runs now, before the first page is served, not during it.
        gc.collect()
        self.loaded_in = time.perf_counter() - started
        self.changed = time.time()

    # -- the tail ---------------------------------------------------------------------------
    def start(self) -> None:
        threads = [(self._tail, "dashboard-tail"), (self._verify_loop, "dashboard-verify")]
        if not self.usage_ready.is_set():
            threads.append((self._catch_up, "dashboard-usage"))
        for target, name in threads:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        with contextlib.suppress(Exception):
            self._store.close()

    def _tail(self) -> None:
        while not self._stop.is_set():
            try:
                with store_errors(self.store_url):
                    head = self._store.wait_for_append(self.position, WAIT_S)
                    if head <= self.position:
                        continue
                    rows = list(self._store.fold_rows(self.position, min(head, self.position + BATCH)))
            except Exception as exc:  # a lost database: keep serving what is known, retry
                self.tail_error = str(exc)
                log.warning("dashboard tail: %s", exc)
                self._stop.wait(1.0)
                continue
            self.tail_error = None
            if rows:
                self.fold(rows)

    @property
    def state(self) -> LedgerState:
        """The jobs' fold at `position`, less the settled jobs (on `jobs.shelf`): what the
        TPUs, the queue and the metrics read (a settled job holds no TPU and waits for none)."""
        return self.jobs.state

    def job_count(self) -> int:
        """Every job the ledger knows, settled ones included."""
        return len(self.jobs)

    def listing(self) -> Listing:
        """Every job's card in id order, counted (readmodels.Listing): the settled jobs' as
        their shelf keeps it, the live jobs' kept from the last listing while their last
        event is the same (a job's state is its stream's fold: same last event, same card;
        the fold edits a live job's state in place, so the object itself tells nothing), made
        anew for the jobs an event moved. Under the lock."""
        kept, now = self._live_cards, {}
        for job in self.jobs.state.jobs.values():
            known = kept.get(job.id)
            now[job.id] = known if known is not None and known[0] == job.position else (job.position, card_of(job))
        self._live_cards = now  # only the live jobs': one that settled leaves it
        return self.jobs.shelf.listing().merged(Listing.of(card for _, card in now.values()))

    def fold(self, rows: list[tuple]) -> None:
        """Fold new (seq, stream, version, type, time, data) rows and announce them."""
        with self.lock:
            touched: set[str] = set()
            fold_into(self.jobs.state, self.jobs.folding(rows, touched))
            self.jobs.refresh(touched)
            teed = self.capacity.tee(self.health.tee(rows))
            if self._behind is None:
                self.usage.apply_rows(teed)
            else:  # usage is still catching up: it takes these when it is done
                for _ in teed:
                    pass
                self._behind.append(rows)
            self.position = rows[-1][0]
            self.recent.extend({"seq": r[0], "stream": r[1], "type": r[3], "time": r[4]} for r in rows)
            self.changed = time.time()
        for listener in list(self.listeners):
            listener()

    def events_after(self, seq: int) -> tuple[list[dict[str, Any]], bool]:
        """The events announced after `seq` (oldest first), and whether some were already
        dropped from the window (the client then reloads rather than patching)."""
        with self.lock:
            if not self.recent:
                return [], seq < self.position
            oldest = self.recent[0]["seq"]
            return [e for e in self.recent if e["seq"] > seq], seq < oldest - 1

    def _catch_up(self) -> None:
        """Usage loaded up to where the state was (`_load_usage`, then the events after the
        snapshot, CATCH_UP_BATCH a query), then the rows the tail read meanwhile (under the
        lock, so none is lost or folded twice): on a thread of its own, from a connection of
        its own, while the pages are served. Nothing else touches the usage fold until it is
        done: the pages that read it wait."""
        until, store, loaded = self._loaded_at, None, False
        while not (loaded and self.usage.position >= until) and not self._stop.is_set():
            start = self.usage.position
            try:
                with store_errors(self.store_url):
                    store = store or open_store(self.store_url, create=False)
                    with no_cyclic_gc():  # the fold's position is its last row's, also when the read fails
                        if not loaded:
                            self._load_usage(store, until)
                            loaded = True
                            self.usage_read = self.usage.position
                            continue
                        self.usage.apply_rows(store.fold_rows(start, min(until, start + CATCH_UP_BATCH)))
            except Exception as exc:  # a lost database: try again, from where it stopped
                log.warning("dashboard usage: %s", exc)
                if store is not None:
                    with contextlib.suppress(Exception):
                        store.close()
                store = None
                self._stop.wait(1.0)
                continue
            if self.usage.position == start:  # no rows where the ledger had them: nothing more to read
                break
            self.usage_read = self.usage.position
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
        if self._stop.is_set():
            return
        with self.lock:
            for rows in self._behind or ():
                self.usage.apply_rows(rows)
            self._behind = None
            self.usage_read = self.position
            self.usage_ready.set()

    def wait_for_usage(self) -> None:
        """What a page that reads usage calls first: at start it waits for the catch-up
        (USAGE_WAIT_S at most), then UsagePending (a 503 saying how far it is)."""
        if not self.usage_ready.wait(USAGE_WAIT_S):
            raise UsagePending(f"usage is still being read from the ledger ({self.usage_read:,} of "
                               f"{self.position:,} events); try again in a few seconds")

    # -- verify -----------------------------------------------------------------------------
    def _verify_loop(self) -> None:
        """Verify at start, then again whenever the ledger grew: no sooner than 20 times the
        last run took (verify then costs at most ~5% of a core, 2 s at least) and no later
        than `verify_every` seconds."""
        checked_head, last_run = -1, 0.0
        while not self.usage_ready.wait(1.0):  # usage's catch-up first: both want the interpreter
            if self._stop.is_set():
                return
        while not self._stop.is_set():
            pause = min(self.verify_every, max(VERIFY_MIN_S, VERIFY_RATIO * last_run))
            if self.position != checked_head:
                checked_head = self.position
                last_run = self.verify_now().seconds
                if self._stop.wait(pause):
                    return
            elif self._stop.wait(1.0):
                return

    def verify_now(self) -> VerifyRun:
        started, clock = datetime.now(UTC), time.perf_counter()
        self.verifying = True
        try:
            store = open_store(self.store_url, create=False)
            try:
                with store_errors(self.store_url):
                    run = VerifyRun(format_time(started), 0.0, verify_store(store, progress=self._unless_stopping).to_dict())
            finally:
                store.close()
        except Exception as exc:
            run = VerifyRun(format_time(started), 0.0, None, str(exc))
        finally:
            self.verifying = False
        run = VerifyRun(run.started, time.perf_counter() - clock, run.report, run.error)
        self.last_verify = run
        return run

    def _unless_stopping(self, _walked: int) -> None:
        """verify's progress: the dashboard closing stops a verify of a large ledger (within
        20,000 events), which used to hold its stop for ~8 s at 1M events."""
        if self._stop.is_set():
            raise VerifyStopped("the dashboard is stopping")

    def _load_usage(self, store: Store, until: int) -> None:
        """The usage fold and the fair-share meter of the recorded policy's half-life from its
        usage snapshot at or before `until` (fresh ones when none is usable): the caller folds
        the events after it. The first visit to the queue then finds the meter made."""
        meter, usage = usage_start(store, half_life_of(store), until)
        usage.send_intervals_to(self._closed)
        self.meter, self.usage = meter, usage

    def _closed(self, iv: Interval) -> None:
        """An interval the usage fold closed: into the fair-share meter (the fold itself keeps
        the weekly table)."""
        if self.meter is not None:
            self.meter.add(iv)

    # -- what the pages ask -----------------------------------------------------------------
    def recent_usage(self, policy: Policy | None, store: Store, now_us: int | None = None) -> admission.Usage:
        """The fair-share and weekly figures admission plans with (`ledger queue`'s). The meter
        depends on the policy's half-life: the one recorded at start is loaded with usage; a
        visit under another (the policy changed since) loads that one's once (its snapshot and
        the events after it, outside the lock up to where the tail stands, the rest under it);
        from then on the tail feeds it, as the reconciler's loop does."""
        if policy is None or not admission.active(policy):
            return admission.NO_USAGE
        self.wait_for_usage()
        half_life = policy.fair_share.half_life_hours
        meter = self.meter
        if meter is None or meter.half_life_hours != half_life:
            with self.lock:
                position = self.usage.position
            meter, fold = load_usage(store, half_life, position)
            with self.lock:
                fold.apply_rows(store.fold_rows(position, self.usage.position))
                self.meter = meter
        now = self.now_us() if now_us is None else now_us
        with self.lock:
            return admission.usage_at(meter, self.usage.open_intervals(now, held=True), now)

    def now_us(self) -> int:
        return to_us(datetime.now(UTC))

    def rollup(self, by: str) -> Rollup:
        """The usage page's kept sums for grouping `by` (`report_of` them under `lock`)."""
        found = self._rollups.get(by)
        if found is None:
            found = self._rollups[by] = Rollup(by)
        return found

    def cached(self, name: str, key: Any, make: Callable[[], Any]) -> Any:
        """The answer of page `name` for `key` (a position, a moment), made once: requests
        for the same key share it. One answer per page is kept, so this stays small."""
        with self._cache_lock:
            found = self._pages.get(name)
        if found is not None and found[0] == key:
            return found[1]
        value = make()
        with self._cache_lock:
            self._pages[name] = (key, value)
        return value

    def publisher(self, store: Store) -> dict[str, Any]:
        """The outbox publisher's cursor for this dashboard's topic and how far it lags."""
        cursor = store.get_cursor(cursor_name(self.topic))
        return {"topic": self.topic, "cursor": cursor, "lag": max(0, self.position - cursor)}
