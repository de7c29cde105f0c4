"""The accounting fold: where every chip-microsecond of every job attempt went. Pure, incremental.

Feed it the ledger's events in seq order (`apply` for one decoded event, `apply_rows` for the
store's `fold_rows` tuples) and ask `figures(now)` at any time: a dashboard keeps one fold
and feeds it the tail; `ledger usage --until T` feeds it the events up to T and asks at T.

Each job is, at every instant, in at most one category (docs/usage.md explains them):

- waiting       live, and holding no TPU (pending, queued, between a released TPU and the
                next one), or a queued resource that is not ACTIVE yet: no chips are held,
                so it is weighed by the chips the spec asks for;
- provisioning  a TPU is being created (`provisioning` .. `provisioned`);
- setup         the TPU is ready and the hosts are being set up (`provisioned` .. `started`);
- running       the job's command runs (`started` .. its end or an interruption);
- recovering    from a preemption or failure (`preempted`, `failed`, `setup_failed`) until
                the job runs again (`started`), whatever the TPU does meanwhile (the old TPU
                still held, a new one provisioning, setup again);
- after_end     the job ended (finished, cancelled or failed for good, or a cancel was
                requested) but still holds its TPU (until `released`).

All but waiting hold chips; chip-time held is their sum. Every category is weighed by the
chips of the TPU in question (`ledger.tpu_types`). An interval belongs to an account: the job,
its submission (`life`: a resubmitted job starts again at attempt 1), the attempt, and the
TPU's accelerator, zone and pricing model (for waiting: the ones the spec asks for).

Times are integer microseconds since the epoch, so sums are exact. An event whose time is
earlier than the job's previous event (clocks of two writers) counts as happening at that
previous time: one job's intervals never overlap and never run backwards. (Only times the
fold uses are parsed; an event whose time is not used changes nothing that a time bounds.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import msgspec

from ledger.placement import chips_of, slices_of
from ledger.usage.prices import PriceBook, Prices, from_event

# Categories: indexes into an account's figures, and the phases a job moves through.
WAITING, PROVISIONING, SETUP, RUNNING, RECOVERING, AFTER_END = range(6)
CATEGORIES = ("waiting", "provisioning", "setup", "running", "recovering", "after_end")
HELD = (PROVISIONING, SETUP, RUNNING, RECOVERING, AFTER_END)
# The other figures of an account: preemptions (count), work lost to them (chip-us),
# completed recoveries (count) and their total wall time (us); then the cost of the chips
# held (USD, each interval at the price in force when it happened) and what they would have
# cost on demand, and the prices ("family/pricing") each of the two missed (frozensets).
# PRICED is the held chip-time already priced: costs are settled lazily (at a price change,
# and when figures are asked), so counting an interval costs nothing more than its sum.
PREEMPTIONS, LOST, RECOVERIES, RECOVER_US = 6, 7, 8, 9
COST, ONDEMAND, MISSING, MISSING_ONDEMAND, PRICED = 10, 11, 12, 13, 14
SLOTS = 15
US_PER_HOUR = 3_600_000_000
WEEK_US = 7 * 24 * US_PER_HOUR
_MONDAY = 4 * 86_400 * 1_000_000  # 1970-01-05, the first Monday after the epoch
_NONE: frozenset[str] = frozenset()


def week_of(us: int) -> int:
    """The start (us) of the week holding `us`: the Monday before it, 00:00 UTC."""
    return us - (us - _MONDAY) % WEEK_US


def add_to_weeks(weeks: dict[tuple[int, str], list[int]], owner: str, category: int, start: int, end: int,
                 chips: int) -> None:
    """Chip-microseconds of one stretch [start, end) into `weeks`, (week start, owner) -> one
    sum per category, split at each Monday 00:00 UTC it crosses."""
    while start < end:
        week = week_of(start)
        stop = end if end < week + WEEK_US else week + WEEK_US
        values = weeks.get((week, owner))
        if values is None:
            values = weeks[week, owner] = [0] * len(CATEGORIES)
        values[category] += (stop - start) * chips
        start = stop


def blank() -> list:
    """An account's figures before anything is counted."""
    return [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, _NONE, _NONE, 0]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_FAR = 2**62  # an open end of the window
# Where a job is in its life, as far as accounting cares.
NEW, LIVE, CANCELLING, ENDED = range(4)


def to_us(moment: str | datetime) -> int:
    """An event time (ISO, 'Z') or an aware datetime as integer microseconds since the epoch."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    if moment.tzinfo is None:
        raise ValueError("times must be timezone-aware")
    return (moment - _EPOCH) // _US


def from_us(us: int) -> datetime:
    return _EPOCH + us * _US


class AccountKey(NamedTuple):
    job: str
    life: int  # which submission of the job (1 = the first)
    attempt: int
    accelerator: str
    zone: str
    pricing: str

    @property
    def owner(self) -> str:
        return self.job.partition("/")[0]


class Interval(NamedTuple):
    """One stretch of one category, kept only when the fold is asked to (tests, one job)."""

    key: AccountKey
    category: int
    start: int  # us, within the window
    end: int
    chips: int


def _text(value: Any, default: str = "") -> str:
    return value if value and type(value) is str else default


def _int(value: Any, default: int) -> int:
    return value if type(value) is int else default


class _Job:
    """The accounting state of one job stream (not the job fold's JobState: only what the
    categories need)."""

    __slots__ = (
        "id", "life", "status", "phase", "recovering", "recover_since", "attempt", "open", "since", "last",
        "want", "want_chips", "want_key", "tpu_name", "held", "held_chips", "held_key", "run_start",
        "checkpoint", "step", "suspect", "per_attempt", "keys",
    )

    def __init__(self, job_id: str, per_attempt: bool) -> None:
        self.id = job_id
        self.per_attempt = per_attempt  # accounts per attempt, or one per job submission
        self.life = 0
        self.status = NEW
        self.phase = WAITING
        self.recovering = False
        self.recover_since = 0
        self.attempt = 0
        # The open interval: what the job has been doing since `since` (category, account,
        # chips), or None while nothing is counted.
        self.open: tuple[int, AccountKey, int] | None = None
        self.since = 0
        self.last = 0  # time of the job's latest event (times never run backwards)
        self.want: tuple[str, str, str] = ("", "", "ondemand")  # accelerator, zone, pricing asked for
        self.want_chips = 0
        self.want_key: AccountKey | None = None
        self.tpu_name: str | None = None  # the TPU held, if any
        self.held: tuple[str, str, str] = ("", "", "")  # its accelerator, zone, pricing
        self.held_chips = 0
        self.held_key: AccountKey | None = None
        self.run_start: int | None = None  # when the current attempt started running
        self.checkpoint: int | None = None  # its last reported checkpoint
        self.step: int | None = None
        # A failure while running that may turn out to be a preemption seen first from the
        # host's side (the recovery then says kind "preempted"): (time, lost chip-us, key).
        self.suspect: tuple[int, int, AccountKey] | None = None
        # The accounts it added to since it last closed them (a tuple: a snapshot copies
        # jobs' fields as they are), None when there are none.
        self.keys: tuple[AccountKey, ...] | None = None

    @classmethod
    def of_row(cls, row: tuple) -> _Job:
        """A job from its fields in `__slots__` order (a usage snapshot's row, its account
        keys already named tuples): one unpacking, ~3x as fast as a setattr a field, which
        is what reading 118,956 jobs' rows spent most of its 1.2 s on."""
        job = cls.__new__(cls)
        (job.id, job.life, job.status, job.phase, job.recovering, job.recover_since, job.attempt, job.open, job.since,
         job.last, job.want, job.want_chips, job.want_key, job.tpu_name, job.held, job.held_chips, job.held_key,
         job.run_start, job.checkpoint, job.step, job.suspect, job.per_attempt, job.keys) = row
        return job


class UsageFold:
    """Accounts of every job, kept current event by event.

    `since`/`until` (us, or None for open) bound the window: only the part of each interval
    inside it counts, and only preemptions and recoveries that happen inside it. Events
    before `since` are still folded (they say what each job was doing when the window opens).
    `per_attempt` keeps one account per attempt instead of one per job submission.
    `keep_intervals` also records every interval (memory grows with the ledger: for tests
    and single jobs); `on_interval` is called with each interval as it closes (the
    fair-share meter is fed so). A whole-ledger fold per submission also adds them up by
    week and owner (`weeks`). Open intervals are not closed: ask `open_intervals(now)` for
    those.

    An interval ends only when what the job does changes (its category, account or chips),
    or when the prices change (a `policy_changed` event on the `_policy` stream): events that
    change nothing split nothing. Each interval that holds chips is priced when it closes,
    at the table in force over it; `prices` override the ledger's table for the whole
    report (`ledger usage --price`).
    """

    def __init__(self, since: int | None = None, until: int | None = None, *,
                 per_attempt: bool = False, keep_intervals: bool = False,
                 on_interval: Callable[[Interval], None] | None = None, prices: Prices | None = None) -> None:
        self.lo = since if since is not None else -_FAR
        self.hi = until if until is not None else _FAR
        self.per_attempt = per_attempt
        self.accounts: dict[AccountKey, list[int]] = {}
        # Accounts closed for good: their job ended with nothing open, so they were priced
        # and moved here, in the order they closed; a job revived later (`ledger resume`)
        # moves those it adds to back. Reports add them up first, then `accounts`: a
        # report kept from one request to the next (`report.Rollup`) adds up only what
        # closed since, and the many finished jobs of a long ledger are not copied and
        # priced again for every report.
        self.closed: dict[AccountKey, list[int]] = {}
        self.reopened = 0  # how many times an account left `closed` (its order changed)
        self.jobs: dict[str, _Job] = {}
        # One tuple (and its strings) for each distinct (accelerator, zone, pricing) asked for
        # or held: every job's `want` and `held`, and the account keys made of them, share
        # them (decoded events give each job strings of its own; ~250 B a job at 118,956).
        self._places: dict[tuple[str, str, str], tuple[str, str, str]] = {}
        self.position = 0
        self.prices = PriceBook(prices)
        # Chip-time by week and owner, (week start, owner) -> one sum per category, of the
        # intervals closed so far (the dashboard's weekly table; open ones are added when it
        # is asked): kept by a whole-ledger fold per submission, so a usage snapshot holds it
        # and a reader need not fold from the first event to draw the weeks. Weeks times owners.
        self.weeks: dict[tuple[int, str], list[int]] | None = (
            {} if since is None and until is None and not per_attempt else None)
        self.intervals: list[Interval] | None = [] if keep_intervals else None
        self._sinks: tuple[Callable[[Interval], None], ...] = ()
        self.send_intervals_to(on_interval)

    def send_intervals_to(self, on_interval: Callable[[Interval], None] | None) -> None:
        """Hand each interval closed from now on to `on_interval` (in place of the one given
        before: a fold loaded from a snapshot feeds its reader's meter)."""
        sinks = (self.intervals.append if self.intervals is not None else None, on_interval)
        self._sinks = tuple(f for f in sinks if f is not None)

    # -- feeding ----------------------------------------------------------------------------
    def apply(self, stream: str, type_: str, time: str, data: Mapping[str, Any], seq: int = 0) -> None:
        """Fold one event whose data is already decoded (an `Event`'s fields)."""
        self.apply_rows(((seq, stream, 0, type_, time, data),), decoded=True)

    def apply_rows(self, rows: Iterable[tuple], *, decoded: bool = False) -> UsageFold:
        """Fold (seq, stream, version, type, time, data JSON) rows, as the store's `fold_rows`
        yields them (`decoded`: data is already a dict). Types the accounting ignores are
        skipped before their time or data is even parsed, and data is decoded only for the
        types whose handler reads it."""
        handlers, needs, timed, jobs, per_attempt = _HANDLERS, _NEEDS_DATA, _NEEDS_TIME, self.jobs, self.per_attempt
        at, where_of, close, closed = _at, _where, self._close, self.closed
        loads = _as_is if decoded else _loads
        seq = 0
        try:
            for seq, stream, _version, type_, time_, data in rows:  # noqa: B007 (the last one is kept)
                handler = handlers.get(type_)
                if handler is None or stream[:1] == "_":  # not a job stream
                    if type_ == "policy_changed":
                        self._policy_changed(to_us(time_), loads(data))
                    continue
                job = jobs.get(stream)
                if job is None:
                    job = jobs[stream] = _Job(stream, per_attempt)
                # An event's time is parsed only when it is used: by the handlers that note
                # times, or to end an interval. Most events change neither.
                t = at(job, time_) if type_ in timed else None
                handler(self, job, t, loads(data) if type_ in needs else _NO_DATA)
                where = where_of(job)
                if where != job.open:
                    if t is None:
                        t = at(job, time_)
                    close(job, t)
                    job.open, job.since = where, t
                    if where is not None and where[1] in closed:  # a revived job: the account is open again
                        self._account(where[1], job)
                if job.status == ENDED and job.open is None and job.keys is not None:
                    self._close_accounts(job)
        finally:
            if seq:
                self.position = seq
        return self

    # -- reading ----------------------------------------------------------------------------
    def figures(self, now: int | None = None, opened: list[Interval] | None = None, *,
                closed: bool = True) -> dict[AccountKey, list]:
        """Every account's figures (indexes: the categories, then PREEMPTIONS, LOST,
        RECOVERIES, RECOVER_US) with each job's open interval counted up to `now` (us; capped
        by the window's end; None = the window's end, or nothing open when it has none):
        the closed accounts first, in the order they closed (the fold's own lists: read
        them, never change them; `closed=False` leaves them out), then the others, each a
        copy priced up to now. `opened`: `open_intervals(now)` when the caller has it
        already (the dashboard's usage page also adds them to its weekly table). The fold
        itself is not changed: ask again later, feed it more."""
        out: dict[AccountKey, list] = dict(self.closed) if closed else {}
        copies = {key: values[:] for key, values in self.accounts.items()}
        out.update(copies)
        end = self.hi if now is None else min(now, self.hi)
        if end < _FAR:
            for iv in self.open_intervals(end) if opened is None or end != now else opened:
                values = copies.get(iv.key)
                if values is None:  # nothing counted in it yet (an open interval's account is never closed)
                    values = out[iv.key] = copies[iv.key] = blank()
                values[iv.category] += (iv.end - iv.start) * iv.chips
        for key, values in copies.items():
            self._settle(key, values)
        return out

    def open_intervals(self, now: int, *, held: bool = False) -> list[Interval]:
        """The interval each job is in, as it would close at `now` (within the window);
        with `held`, only those that hold chips (fair share and weekly quotas count no
        other: a lab's thousands of waiting jobs are skipped, not built and dropped)."""
        found = []
        for job in self.jobs.values():
            if job.open is not None and job.open[2] and (not held or job.open[0] != WAITING):
                start, end = max(job.since, self.lo), min(now, self.hi)
                if end > start:
                    category, key, chips = job.open
                    found.append(Interval(key, category, start, end, chips))
        return found

    def checkpoint_of(self, job_id: str) -> tuple[int, int] | None:
        """(attempt, step) of the job's last checkpoint in its current attempt, if reported."""
        job = self.jobs.get(job_id)
        if job is None or job.step is None:
            return None
        return job.attempt, job.step

    # -- intervals and counts -------------------------------------------------------------------
    def _close(self, j: _Job, t: int) -> None:
        """Count job `j`'s open interval, [since, t), inside the window."""
        if j.open is None:
            return
        category, key, chips = j.open
        a = j.since if j.since > self.lo else self.lo
        b = t if t < self.hi else self.hi
        if b > a and chips:
            self._account(key, j)[category] += (b - a) * chips
            if self.weeks is not None:
                add_to_weeks(self.weeks, key.owner, category, a, b, chips)
            if self._sinks:
                interval = Interval(key, category, a, b, chips)
                for sink in self._sinks:
                    sink(interval)

    def _settle(self, key: AccountKey, values: list) -> None:
        """Price the account's held chip-time counted since it was last priced, at the table
        in force now; a missing price is named and leaves that cost unknown."""
        held = values[1] + values[2] + values[3] + values[4] + values[5]  # HELD
        chip_us = held - values[PRICED]
        if not chip_us:
            return
        values[PRICED] = held
        rate, ondemand, name, ondemand_name = self.prices.rates(key.accelerator, key.pricing)
        if rate is None:
            if name not in values[MISSING]:
                values[MISSING] = _with(values[MISSING], name)
        else:
            values[COST] += chip_us * rate / US_PER_HOUR
        if ondemand is None:
            if ondemand_name not in values[MISSING_ONDEMAND]:
                values[MISSING_ONDEMAND] = _with(values[MISSING_ONDEMAND], ondemand_name)
        else:
            values[ONDEMAND] += chip_us * ondemand / US_PER_HOUR

    def _policy_changed(self, t: int, data: Mapping[str, Any]) -> None:
        """New prices from `t` on: every open interval is split at `t` and everything counted
        so far is priced at the old table; what comes after is priced at the new one."""
        for job in self.jobs.values():
            if job.open is not None and job.since < t:
                self._close(job, t)
                job.since = t
                job.last = max(job.last, t)
        for key, values in self.accounts.items():
            self._settle(key, values)
        commit = data.get("commit")
        self.prices.replace(from_event(data), commit if isinstance(commit, str) else None)

    def _account(self, key: AccountKey, j: _Job) -> list:
        """Job `j`'s account `key`, to add to: made when new, back from `closed` when a
        revived job adds to it again."""
        values = self.accounts.get(key)
        if values is None:
            values = self.closed.pop(key, None)
            if values is None:
                values = blank()
            else:
                self.reopened += 1
            self.accounts[key] = values
        if j.keys is None:
            j.keys = (key,)
        elif key not in j.keys:
            j.keys = (*j.keys, key)
        return values

    def _close_accounts(self, j: _Job) -> None:
        """Job `j` ended with nothing open: its accounts are priced (at the table in force,
        as a price change or a report would price them) and move to `closed`."""
        for key in j.keys or ():
            values = self.accounts.pop(key, None)
            if values is not None:
                self._settle(key, values)
                self.closed[key] = values
        # Its accounts' keys are caches of its fields (`_want_key`, `_held_key`): an ended job
        # is rarely asked for them again, and a lab's history of ended jobs held two each.
        j.keys = j.want_key = j.held_key = None

    def _count(self, key: AccountKey, j: _Job, t: int, slot: int, amount: int, slot2: int, amount2: int) -> None:
        """Add to two of job `j`'s account's counters for what happened at `t`, if inside the window."""
        if self.lo <= t <= self.hi:
            values = self._account(key, j)
            values[slot] += amount
            values[slot2] += amount2

    # -- what each event means: each changes the job's state; apply_rows then closes the open
    # -- interval if what the job does changed. They read the state as it was before the event.
    def _submitted(self, j: _Job, t: int | None, d: Mapping[str, Any]) -> None:
        # A new life, as the job fold starts one: a TPU still held by the previous life is
        # no longer the job's (the job fold forgets it too, and the planner collects it).
        j.life += 1
        j.status, j.phase, j.recovering, j.attempt = LIVE, WAITING, False, 0
        j.tpu_name = j.held_key = j.run_start = j.checkpoint = j.step = j.suspect = None
        _want(j, d.get("spec"), self._places)

    def _spec_updated(self, j: _Job, t: int | None, d: Mapping[str, Any]) -> None:
        _want(j, d.get("spec"), self._places)

    def _cancel_requested(self, j: _Job, t: int | None, d: Mapping[str, Any]) -> None:
        if j.status == LIVE:
            _stop(j, CANCELLING)

    def _queued(self, j: _Job, t: int | None, d: Mapping[str, Any]) -> None:
        if j.status == LIVE:
            j.phase = WAITING

    def _provisioning(self, j: _Job, t: int | None, d: Mapping[str, Any]) -> None:
        attempt = _int(d.get("attempt"), j.attempt)
        if attempt != j.attempt:
            j.attempt, j.want_key, j.held_key = attempt, None, None
        _take(j, d.get("tpu"), self._places)
        if j.status == LIVE:
            j.phase = PROVISIONING

    def _provisioned(self, j: _Job, t: int | None, d: Mapping[str, Any]) -> None:
        _take(j, d.get("tpu"), self._places)
        if j.status == LIVE:
            j.phase = SETUP

    def _provision_failed(self, j: _Job, t: int | None, d: Mapping[str, Any]) -> None:
        if j.status == LIVE:
            if d.get("final"):
                _stop(j, ENDED)
            else:
                j.phase = WAITING

    def _setup(self, j: _Job, t: int | None, d: Mapping[str, Any]) -> None:
        if j.status == LIVE:
            j.phase = SETUP

    def _setup_failed(self, j: _Job, t: int, d: Mapping[str, Any]) -> None:
        if not d.get("final"):
            _interrupted(j, t)
        elif j.status == LIVE:  # as in the job fold, a cancel under way stays one
            _stop(j, ENDED)

    def _started(self, j: _Job, t: int, d: Mapping[str, Any]) -> None:
        if j.status == LIVE and j.recovering:
            j.recovering = False
            self._count(_current_key(j), j, t, RECOVERIES, 1, RECOVER_US, t - j.recover_since)
        j.phase, j.run_start, j.checkpoint, j.step, j.suspect = RUNNING, t, None, None, None

    def _preempted(self, j: _Job, t: int, d: Mapping[str, Any]) -> None:
        self._count(_current_key(j), j, t, PREEMPTIONS, 1, LOST, self._lost(j, t))
        j.suspect = None
        _interrupted(j, t)

    def _failed(self, j: _Job, t: int, d: Mapping[str, Any]) -> None:
        if d.get("final"):
            if j.status in (LIVE, CANCELLING):  # the job fold ends even a cancelling job here
                _stop(j, ENDED)
            return
        lost = self._lost(j, t)
        j.suspect = (t, lost, _current_key(j)) if lost else None
        _interrupted(j, t)

    def _lost(self, j: _Job, t: int) -> int:
        """Chip-us of work lost if the running attempt stops at `t`: back to its last
        checkpoint, or to its start when it reported none (the part inside the window)."""
        if j.status != LIVE or j.phase != RUNNING or j.recovering or j.run_start is None or j.tpu_name is None:
            return 0
        since = j.checkpoint if j.checkpoint is not None else j.run_start
        return max(0, min(t, self.hi) - max(since, self.lo)) * j.held_chips

    def _recovery(self, j: _Job, t: int | None, d: Mapping[str, Any]) -> None:
        # `resumed` / `rerun`: a new attempt begins, on the same TPU or (after the old one was
        # released) on a new one; or `ledger resume`/`rerun` revives an ended job.
        if j.suspect is not None and d.get("kind") == "preempted":
            # The failure was the preemption, seen first from the host's side.
            when, lost, key = j.suspect
            self._count(key, j, when, PREEMPTIONS, 1, LOST, lost)
        j.suspect = None
        attempt = _int(d.get("attempt"), j.attempt + 1)
        if attempt != j.attempt:
            j.attempt, j.want_key, j.held_key = attempt, None, None
        if j.status == ENDED:
            j.status, j.recovering = LIVE, False
        j.phase, j.run_start, j.checkpoint, j.step = SETUP, None, None, None

    def _ended(self, j: _Job, t: int | None, d: Mapping[str, Any]) -> None:
        if j.status in (LIVE, CANCELLING):
            _stop(j, ENDED)

    def _released(self, j: _Job, t: int | None, d: Mapping[str, Any]) -> None:
        tpu = d.get("tpu")
        name = tpu.get("name") if isinstance(tpu, Mapping) else d.get("name")
        if j.tpu_name is not None and (name is None or name == j.tpu_name):
            if _never_existed(d) and j.open is not None and j.open[0] in (PROVISIONING, RECOVERING) \
                    and j.open[1] == j.held_key:
                # Its create failed: Google never gave the job this TPU, so the time since it
                # was asked for was spent waiting, not holding chips (usage bills TPUs that existed).
                j.open = (WAITING, _want_key(j), j.want_chips)
            j.tpu_name = j.held_key = None

    def _checkpointed(self, j: _Job, t: int, d: Mapping[str, Any]) -> None:
        # A checkpoint changes what a preemption would lose, not what the job is doing.
        if j.status == LIVE and j.phase == RUNNING and j.run_start is not None \
                and _int(d.get("attempt"), j.attempt) == j.attempt:
            j.checkpoint, j.step = t, _int(d.get("step"), j.step or 0)


# -- small pure helpers on one job's accounting state ---------------------------------------
def _never_existed(d: Mapping[str, Any]) -> bool:
    """A release of a TPU whose create failed (`existed` false); ledgers written before that
    field said it as "vanished while provisioning"."""
    return d.get("existed") is False or d.get("reason") == "vanished while provisioning"


def _at(j: _Job, time: str) -> int:
    """An event's time in us, never before the job's previous one."""
    t = (_parse(time) - _EPOCH) // _US
    if t < j.last:
        return j.last
    j.last = t
    return t


_parse = datetime.fromisoformat


def _where(j: _Job) -> tuple[int, AccountKey, int] | None:
    """(category, account, chips) of what job `j` is doing now, or None (not counted)."""
    if j.status != LIVE:
        if j.tpu_name is None or j.status == NEW:
            return None
        return AFTER_END, j.held_key or _held_key(j), j.held_chips
    if j.tpu_name is None or j.phase == WAITING:
        return WAITING, j.want_key or _want_key(j), j.want_chips
    return (RECOVERING if j.recovering else j.phase), j.held_key or _held_key(j), j.held_chips


def _held_key(j: _Job) -> AccountKey:
    key = j.held_key
    if key is None:
        key = j.held_key = AccountKey(j.id, j.life, (j.attempt or 1) if j.per_attempt else 0, *j.held)
    return key


def _want_key(j: _Job) -> AccountKey:
    # Waiting before the first attempt is waiting for attempt 1.
    key = j.want_key
    if key is None:
        key = j.want_key = AccountKey(j.id, j.life, (j.attempt or 1) if j.per_attempt else 0, *j.want)
    return key


def _current_key(j: _Job) -> AccountKey:
    """The account of the TPU the job holds, or of the one it asks for."""
    return _held_key(j) if j.tpu_name is not None else _want_key(j)


def _want(j: _Job, spec: Any, places: dict[tuple[str, str, str], tuple[str, str, str]]) -> None:
    tpu = spec.get("tpu") if isinstance(spec, Mapping) else None
    if isinstance(tpu, Mapping):
        want = (_text(tpu.get("accelerator")), _text(tpu.get("zone")), _text(tpu.get("pricing"), "ondemand"))
        j.want = places.setdefault(want, want)
    else:
        j.want = ("", "", "ondemand")
    j.want_chips, j.want_key = chips_of(j.want[0], slices_of(tpu)), None


def _take(j: _Job, tpu: Any, places: dict[tuple[str, str, str], tuple[str, str, str]]) -> None:
    """The job holds `tpu` (from provisioning/provisioned): the same TPU again keeps what is
    known of it; another one replaces it, as in the job fold. Pricing is the spec's at the
    time, unless the event names one."""
    if not isinstance(tpu, Mapping):
        return
    name = _text(tpu.get("name"), "?")
    if name == j.tpu_name and tpu.get("accelerator", j.held[0]) == j.held[0] \
            and tpu.get("zone", j.held[1]) == j.held[1] and "pricing" not in tpu and "slices" not in tpu:
        return  # the TPU held, as known (provisioned after its provisioning)
    base = j.held if name == j.tpu_name else j.want
    held = (_text(tpu.get("accelerator"), base[0]), _text(tpu.get("zone"), base[1]), _text(tpu.get("pricing"), base[2]))
    held = places.setdefault(held, held)
    chips = chips_of(held[0], slices_of(tpu))  # every slice of it
    j.tpu_name = name
    if held != j.held or chips != j.held_chips:  # the account changes only with what the TPU is
        j.held, j.held_chips, j.held_key = held, chips, None


def _interrupted(j: _Job, t: int) -> None:
    """A preemption or failure: the job recovers from now until it runs again."""
    if j.status == LIVE:
        if not j.recovering:
            j.recovering, j.recover_since = True, t
        j.run_start = None


# The sets of missing prices, one object per distinct set: a lab without a price table
# prices 100k closed accounts with the same one or two names missing, which would
# otherwise be 100k sets of their own (~45 MB at 118,956 jobs) in every fold and snapshot.
_SETS: dict[tuple[frozenset[str], str], frozenset[str]] = {}


def _with(names: frozenset[str], name: str) -> frozenset[str]:
    found = _SETS.get((names, name))
    if found is None:
        found = _SETS[names, name] = names | {name}
    return found


def _stop(j: _Job, status: int) -> None:
    j.status, j.recovering, j.run_start, j.suspect = status, False, None, None


def _as_is(data: Any) -> Mapping[str, Any]:
    return data


# The decoder replay's fold uses (replay.fold_into): the same values as json.loads, ~2.5x
# faster than json's own scanner for the small objects events carry.
_loads = msgspec.json.decode


_HANDLERS = {
    "submitted": UsageFold._submitted,
    "spec_updated": UsageFold._spec_updated,
    "cancel_requested": UsageFold._cancel_requested,
    "queued": UsageFold._queued,
    "provisioning": UsageFold._provisioning,
    "provisioned": UsageFold._provisioned,
    "provision_failed": UsageFold._provision_failed,
    "setup_started": UsageFold._setup,
    "setup_done": UsageFold._setup,
    "setup_failed": UsageFold._setup_failed,
    "started": UsageFold._started,
    "preempted": UsageFold._preempted,
    "failed": UsageFold._failed,
    "resumed": UsageFold._recovery,
    "rerun": UsageFold._recovery,
    "finished": UsageFold._ended,
    "cancelled": UsageFold._ended,
    "released": UsageFold._released,
    "checkpointed": UsageFold._checkpointed,
}
# Types whose handler never reads `data`: their data is not decoded at all.
_NEEDS_DATA = frozenset(_HANDLERS) - {
    "cancel_requested", "queued", "setup_started", "setup_done", "started", "preempted", "finished", "cancelled",
}
_NO_DATA: Mapping[str, Any] = {}
# Types whose handler notes the event's time (the others get None; their time is parsed
# only when the job's interval changes).
_NEEDS_TIME = frozenset({"started", "preempted", "failed", "setup_failed", "checkpointed"})
