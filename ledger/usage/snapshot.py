"""The usage fold and its fair-share meter from a checked snapshot plus the events after it.

The second kind of snapshot beside the job states' (ledger.snapshots): the accounting fold
(`UsageFold`, whole ledger, one account per submission, the ledger's own prices) and the
`ShareMeter` it feeds, saved at a position. It is checked exactly as a job-state snapshot
is (`replay.checked_snapshot`: its own hash, the event it names in the chain, this code's
version, it decodes to its position) and saved by the same rule (`replay.snapshot_due`).
The meter depends on the fair-share half-life, so each half-life has its own snapshot
name; the accounts do not, so `ledger usage` may start from any of them.

Folding snapshot + tail gives exactly the figures of a fold of every event: the state saved
is the fold's whole state (every job's accounting state, open intervals, accounts, prices in
force, the meter's sums), and folding is deterministic (tests/usage/test_usage_snapshot.py).
"""

from __future__ import annotations

import hashlib
import operator
import pickle
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ledger.replay import SNAPSHOT_EVERY, checked_snapshot, snapshot_due, tied_snapshot
from ledger.snapshots.plain import load_plain, no_cyclic_gc
from ledger.store.base import Snapshot, SnapshotReader
from ledger.usage import fold as usage_fold
from ledger.usage import prices, share
from ledger.usage.fold import AccountKey, UsageFold, _Job
from ledger.usage.share import ShareMeter

_MAGIC = b"TLU3"
_LENGTH = 8  # bytes of the admission part's length, after the magic
_SLOTS = _Job.__slots__
_FAR = 2**62
# The fields of a job's accounting state that hold account keys (named tuples: stored as plain tuples).
_KEYED = frozenset({"open", "want_key", "held_key", "suspect", "keys"})

Kept = tuple[ShareMeter, UsageFold]


def snapshot_name(half_life_hours: float) -> str:
    return f"usage/{half_life_hours!r}h"


def half_life_of(name: str) -> float | None:
    """The half-life (hours) a snapshot name says (`snapshot_name`'s inverse); None: not one."""
    try:
        half_life = float(name.removeprefix("usage/").removesuffix("h"))
    except ValueError:
        return None
    return half_life if snapshot_name(half_life) == name else None


def code_version() -> str:
    """The accounting fold's, the prices', the meter's and this encoding's code together."""
    digest = hashlib.sha256()
    for module in (usage_fold, prices, share):
        digest.update(Path(module.__file__ or "").read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


def plain(fold: UsageFold) -> bool:
    """Whether the fold is one a snapshot holds: whole ledger, per submission, no overrides."""
    return (fold.lo == -_FAR and fold.hi == _FAR and not fold.per_attempt and not fold.prices.overrides
            and fold.intervals is None and fold.weeks is not None)


# -- encoding ---------------------------------------------------------------------------------
def _keys_out(name: str, value: Any) -> Any:
    if value is None or name not in _KEYED:
        return value
    if name == "open":
        return (value[0], tuple(value[1]), value[2])
    if name == "suspect":
        return (value[0], value[1], tuple(value[2]))
    if name == "keys":
        return tuple(tuple(k) for k in value)
    return tuple(value)


def _keys_in(name: str, value: Any) -> Any:
    if value is None or name not in _KEYED:
        return value
    if name == "open":
        return (value[0], AccountKey(*value[1]), value[2])
    if name == "suspect":
        return (value[0], value[1], AccountKey(*value[2]))
    if name == "keys":
        return tuple(AccountKey(*k) for k in value)
    return AccountKey(*value)


_ROW = operator.attrgetter(*_SLOTS)  # a job's fields as one tuple, in C (a getattr each took 2.5x as long)
_KEYED_AT = tuple((i, name) for i, name in enumerate(_SLOTS) if name in _KEYED)
_KEYED_OF = operator.itemgetter(*(i for i, _ in _KEYED_AT))  # a row's keyed fields: all None for most jobs
_NO_KEYS = (None,) * len(_KEYED_AT)


def _row(job: _Job) -> tuple:
    row = _ROW(job)
    if any(row[i] is not None for i, _ in _KEYED_AT):
        values = list(row)
        for i, name in _KEYED_AT:
            values[i] = _keys_out(name, values[i])
        row = tuple(values)
    return row


class UsageBody(NamedTuple):
    """What a usage snapshot holds, copied out of the fold and the meter: later folds never
    change it (job fields are immutable values; the containers the fold edits in place, the
    accounts' figures and the meter's sums, are copies), so it can be pickled and saved on
    another thread while folding goes on (the reconciler's snapshot saver)."""

    position: int
    slots: tuple[str, ...]
    jobs: list[tuple]
    accounts: list[tuple[tuple, list]]
    closed: list[tuple[tuple, list]]  # in the order they closed
    weeks: list[tuple[int, str, list[int]]]  # the closed intervals' chip-time by week and owner, sorted
    prices: dict
    prices_commit: str | None
    half_life_hours: float
    ref: float
    acc: dict[str, float]
    recent: list[tuple]


def body_of(meter: ShareMeter, fold: UsageFold) -> UsageBody:
    if not plain(fold):
        raise ValueError("only a whole-ledger usage fold without overrides is saved as a snapshot")
    with no_cyclic_gc():  # 30k new containers set off collections of the reconciler's whole heap
        weeks = sorted((week, owner, list(v)) for (week, owner), v in (fold.weeks or {}).items())
        return UsageBody(fold.position, _SLOTS, [_row(j) for j in fold.jobs.values()],
                         [(tuple(k), list(v)) for k, v in fold.accounts.items()],
                         [(tuple(k), list(v)) for k, v in fold.closed.items()], weeks, dict(fold.prices.table),
                         fold.prices.commit, meter.half_life_hours, meter.ref, dict(meter.acc), list(meter.recent))


_OPEN, _KEYS = _SLOTS.index("open"), _SLOTS.index("keys")


def admission_part(body: UsageBody) -> tuple:
    """What fair share reads of a usage state, apart (`load_for_admission`): the meter, the
    open accounts, and only the jobs that have an interval or an account open, with the
    closed accounts of those jobs; then the ids of the jobs left out (ended, nothing open),
    so that the events after the snapshot can be checked not to touch one. At 118,956 jobs
    that is 10,200 jobs and 200 accounts instead of every job and 108,756 closed accounts."""
    live = [row for row in body.jobs if row[_OPEN] is not None or row[_KEYS] is not None]
    kept = {row[0] for row in live}
    left = [row[0] for row in body.jobs if row[0] not in kept]
    return (*body._replace(jobs=live, closed=[(k, v) for k, v in body.closed if k[0] in kept]), left)


# admission_part's fields (a UsageBody's, then the left-out ids), and where the meter's last week is
_ADMISSION_FIELDS, _RECENT = len(UsageBody._fields) + 1, UsageBody._fields.index("recent")


def encode_body(body: UsageBody) -> bytes:
    """The admission part, then the whole state but the meter's last week (14 MB at 118,956
    jobs: kept once, in the first part), each a plain tuple (the reader refuses classes);
    `decode_admission` reads the first alone, `decode` both."""
    first = pickle.dumps(admission_part(body), protocol=5)
    rest = body._replace(recent=None)
    return _MAGIC + len(first).to_bytes(_LENGTH, "big") + first + pickle.dumps(tuple(rest), protocol=5)


def encode(meter: ShareMeter, fold: UsageFold) -> bytes:
    return encode_body(body_of(meter, fold))


def decode(blob: bytes) -> Kept | None:
    """None when the blob is not a usage snapshot this code can read (it is then ignored)."""
    start = _whole_at(blob)
    if start is None:
        return None
    try:
        *whole, recent = load_plain(blob, start)
        part = load_plain(blob, len(_MAGIC) + _LENGTH)
        if recent is not None or not isinstance(part, tuple) or len(part) != _ADMISSION_FIELDS:
            return None
        return _kept(*whole, part[_RECENT])
    except (pickle.UnpicklingError, ValueError, TypeError, EOFError):
        return None


def decode_admission(blob: bytes) -> tuple[ShareMeter, UsageFold, frozenset[str]] | None:
    """The admission part of a usage snapshot (`admission_part`): the meter and a fold that
    holds only the jobs with something open, and the ids of the jobs it leaves out. None
    when the blob is not one this code can read."""
    if _whole_at(blob) is None:
        return None
    try:
        *whole, left = load_plain(blob, len(_MAGIC) + _LENGTH)
        kept = _kept(*whole)
    except (pickle.UnpicklingError, ValueError, TypeError, EOFError):
        return None
    return None if kept is None else (*kept, frozenset(left))


def admission_difference(blob: bytes, rebuilt: UsageBody) -> str | None:
    """A usage snapshot's admission part against the one of the state rebuilt from the
    events (`ledger verify`, its `body_of`): the part `ledger queue` reads is checked as the
    whole is."""
    try:
        saved = load_plain(blob, len(_MAGIC) + _LENGTH)
    except (pickle.UnpicklingError, ValueError, TypeError, EOFError):
        return "its admission part does not decode"
    mine = admission_part(rebuilt)
    if not isinstance(saved, tuple) or len(saved) != len(mine):
        return "its admission part does not decode"
    return _first_difference((*_PARTS, "left-out jobs"), saved, mine, "admission part's ")


def _whole_at(blob: bytes) -> int | None:
    """Where the whole state's pickle starts in `blob`; None: not a snapshot of this format."""
    if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + _LENGTH:
        return None
    start = len(_MAGIC) + _LENGTH + int.from_bytes(blob[len(_MAGIC):len(_MAGIC) + _LENGTH], "big")
    return start if start < len(blob) else None


def _kept(position: int, slots: Any, jobs: list, accounts: list, closed: list, weeks: list, table: dict,
          commit: str | None, half_life: float, ref: float, acc: dict, recent: list) -> Kept | None:
    if tuple(slots) != _SLOTS:
        return None
    meter = ShareMeter(half_life)
    meter.ref, meter.acc, meter.recent = ref, acc, deque(recent)
    fold = UsageFold(on_interval=meter.add)
    of_row, into = _Job.of_row, fold.jobs
    for row in jobs:
        if len(row) != len(_SLOTS):
            return None
        if _KEYED_OF(row) != _NO_KEYS:
            values = list(row)
            for i, name in _KEYED_AT:
                values[i] = _keys_in(name, values[i])
            row = values
        into[row[0]] = of_row(row)
    fold.accounts = {AccountKey(*k): v for k, v in accounts}
    fold.closed = {AccountKey(*k): v for k, v in closed}
    fold.weeks = {(week, owner): values for week, owner, values in weeks}
    fold.prices.replace(table, commit)
    fold.position = position
    return meter, fold


_PARTS = ("position", "field names", "jobs' accounting states", "accounts", "closed accounts", "weekly sums",
          "price table", "price commit", "half-life", "meter's reference time", "meter's decayed sums", "meter's last week")


def difference(saved: Kept, rebuilt: UsageBody) -> str | None:
    """The first part in which a saved usage state differs from one rebuilt from the events
    (`ledger verify`, its `body_of`), compared as the plain data a snapshot holds; None when
    they agree."""
    return _first_difference(_PARTS, tuple(body_of(*saved)), tuple(rebuilt), "")


def _first_difference(names: tuple[str, ...], saved: tuple, rebuilt: tuple, where: str) -> str | None:
    for name, mine, theirs in zip(names, saved, rebuilt, strict=True):
        if name == "meter's last week":  # a meter asked for a week drops what ended before it: a suffix
            theirs = theirs[len(theirs) - len(mine):] if len(mine) <= len(theirs) else None
        if mine != theirs:
            return f"its {where}{name} differ from the events'"
    return None


def latest(fold: UsageFold) -> int:
    """The latest event time (us) the fold has used: a snapshot may serve a report that ends
    at `hi` only when nothing it counted happened after `hi` (it would have been cut there)."""
    return max((j.last for j in fold.jobs.values()), default=-_FAR)


def _position(kept: Kept) -> int:
    return kept[1].position


# -- the store side -----------------------------------------------------------------------------
def usable(store: SnapshotReader, half_life_hours: float, at_most: int) -> Kept | None:
    """The checked usage snapshot of that half-life at or before `at_most` (None: none usable)."""
    return checked_snapshot(store, snapshot_name(half_life_hours), code_version(), at_most, _decoded, _position)


def _decoded(snap: Snapshot) -> Kept | None:
    return decode(snap.state)


def load_usage(store: SnapshotReader, half_life_hours: float, until: int | None = None,
               use_snapshot: bool = True) -> Kept:
    """The fair-share meter and the usage fold that feeds it, at seq `until` (None = head):
    the newest usable snapshot plus the events after it."""
    head = store.head()
    target = head if until is None else min(until, head)
    with no_cyclic_gc():
        kept = usage_start(store, half_life_hours, target, use_snapshot)
        kept[1].apply_rows(store.fold_rows(kept[1].position, target))
    kept[1].position = target
    return kept


def usage_start(store: SnapshotReader, half_life_hours: float, at_most: int, use_snapshot: bool = True) -> Kept:
    """Where a fold up to `at_most` starts: the newest usable snapshot at or before it, else
    an empty meter and the fold that feeds it (position 0). The caller folds the events after
    it (`load_usage` at once; the dashboard a batch at a time, behind its pages)."""
    kept = usable(store, half_life_hours, at_most) if use_snapshot else None
    if kept is None:
        meter = ShareMeter(half_life_hours)
        kept = meter, UsageFold(on_interval=meter.add)
    return kept


# Events after the snapshot that `load_for_admission` holds at once; past that, the whole fold.
ADMISSION_TAIL_MAX = 4 * SNAPSHOT_EVERY


def load_for_admission(store: SnapshotReader, half_life_hours: float,
                       keep_whole: Callable[[ShareMeter, UsageFold], object] | None = None) -> Kept:
    """The fair-share meter and a usage fold of the jobs with something open, at the head:
    what fair share reads (the meter, and the intervals that hold chips now:
    `fold.open_intervals(now, held=True)`), from a snapshot's admission part plus the events
    after it. The fold leaves the ended jobs out, so it answers nothing else (no figures,
    no report; `load_usage` gives the whole). It is `load_usage`'s answer when no snapshot
    is usable, when the events after it are many, or when one of them touches a job left
    out (a finished job run again), whose state then matters; `keep_whole` is then given
    that whole fold (a reader saves it, so that the next one starts from it)."""
    head = store.head()
    with no_cyclic_gc():
        found = checked_snapshot(store, snapshot_name(half_life_hours), code_version(), head,
                                 _decoded_admission, _admission_position)
        if found is not None and head - found[1].position <= ADMISSION_TAIL_MAX:
            meter, fold, left = found
            rows = list(store.fold_rows(fold.position, head))
            if not any(row[1] in left for row in rows):
                fold.apply_rows(rows)
                fold.position = head
                return meter, fold
    whole = load_usage(store, half_life_hours)
    if keep_whole is not None:
        keep_whole(*whole)
    return whole


def _decoded_admission(snap: Snapshot) -> tuple[ShareMeter, UsageFold, frozenset[str]] | None:
    return decode_admission(snap.state)


def _admission_position(found: tuple[ShareMeter, UsageFold, frozenset[str]]) -> int:
    return found[1].position


def save_usage(store: SnapshotReader, meter: ShareMeter, fold: UsageFold, *, now: int | None) -> None:
    """Save `fold` and `meter`. `now` (us): when, as the saver's clock says; the meter first
    lets go of the intervals no week at `now` or later counts (`ShareMeter.forget_before`),
    or a snapshot would keep every interval of the ledger's history. None keeps them all (a
    test's or a bench's fixed ledger); no default, so a new saver cannot forget its clock."""
    save_body(store, _body_at(meter, fold, now))


def _body_at(meter: ShareMeter, fold: UsageFold, now: int | None) -> UsageBody:
    """What a save at `now` holds (`save_usage`): the meter cut to the weeks from `now` on."""
    if now is not None:
        meter.forget_before(now)
    return body_of(meter, fold)


def save_body(store: SnapshotReader, body: UsageBody) -> None:
    name = snapshot_name(body.half_life_hours)
    store.save_snapshot(tied_snapshot(store, name, code_version(), body.position, encode_body(body)))


def usage_due(store: SnapshotReader, half_life_hours: float, position: int, every: int = SNAPSHOT_EVERY) -> bool:
    """Whether a usage snapshot at `position` is due (the job-state snapshots' rule)."""
    return snapshot_due(store, snapshot_name(half_life_hours), code_version(), position, every)


def maybe_save_usage(store: SnapshotReader, meter: ShareMeter, fold: UsageFold, every: int = SNAPSHOT_EVERY, *,
                     now: int | None) -> bool:
    """Save `fold` and `meter` when a usage snapshot is due (`now` as `save_usage`'s);
    whether it saved."""
    body = due_body(store, meter, fold, every, now=now)
    if body is not None:
        save_body(store, body)
    return body is not None


def due_body(store: SnapshotReader, meter: ShareMeter, fold: UsageFold, every: int = SNAPSHOT_EVERY, *,
             now: int | None) -> UsageBody | None:
    """What to save (`save_body`) when a usage snapshot of `fold` and `meter` is due (`now`
    as `save_usage`'s); else None."""
    if not plain(fold) or not usage_due(store, meter.half_life_hours, fold.position, every):
        return None
    return _body_at(meter, fold, now)
