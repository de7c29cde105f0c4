"""The job-state snapshot's index: what a reader selects jobs on without decoding them
(`JobIndex`), stored as columns (`Columns`): ids, owner and state as codes, the pieces'
places, and only where set the TPU held or awaited and the latest releases.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar, overload

from ledger.fold import TERMINAL, JobState


class JobIndex(NamedTuple):
    """What a reader can select a job on without decoding its state."""

    id: str
    owner: str
    state: str
    held: str | None  # the name of the TPU it holds (`JobState.tpu`), None when it holds none
    held_shared: bool  # that TPU is a shared one
    wants_shared: str | None  # the shared TPU its spec asks for, if it asks for one
    released: tuple[str, ...]  # the TPUs of its latest releases (`JobState.released`)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @classmethod
    def of(cls, job: JobState) -> JobIndex:
        tpu = job.tpu
        want = job.spec.get("tpu") or {}
        return cls(job.id, job.owner, job.state, str(tpu.get("name")) if tpu else None, bool(tpu and tpu.get("shared")),
                   str(want.get("name")) if want.get("shared") else None, tuple(str(r[0]) for r in job.released if r))


class _OwnedAndStated(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def state(self) -> str: ...


Chosen = TypeVar("Chosen", bound=_OwnedAndStated)


job_id_of: Callable[[_OwnedAndStated], str] = operator.attrgetter("id")  # a sort key of 118,956 jobs: no Python call each


def choose(items: Iterable[Chosen], *, owner: str | None = None, state: str | None = None) -> list[Chosen]:
    """The jobs of that owner and in that state, in id order: how `ledger list` (over the
    snapshot's index, `LazyState.select`) and the dashboard (over decoded states,
    `readmodels.select_jobs`) choose, from a JobIndex or a JobState alike."""
    if owner is None and state is None:
        chosen = list(items)
    else:
        chosen = [x for x in items if (owner is None or x.owner == owner) and (state is None or x.state == state)]
    chosen.sort(key=job_id_of)
    return chosen


_UINT32 = next(t for t in "IL" if array(t).itemsize == 4)
NOTHING_HELD = (None, False, None)


def _packed(values: Iterable[int]) -> bytes:
    """Unsigned 32-bit integers, little-endian whatever the machine (a ledger file moves)."""
    out = array(_UINT32, values)
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes()


def _unpacked(data: bytes) -> array:
    out = array(_UINT32)
    out.frombytes(data)
    if sys.byteorder == "big":
        out.byteswap()
    return out


class Columns(NamedTuple):
    """What a snapshot says of every job besides its piece, a column per field, so a
    reader loads 119k jobs' worth in milliseconds and looks at only what it selects on:
    the ids (sorted), owner and state as codes into their few distinct values, the pieces'
    places (job i is in chunk i // CHUNK), and the rare fields where they are set: what
    holders and askers of TPUs hold and ask for (`notable`), and the names of the latest
    releases (flat, each with its job's place)."""

    ids: Sequence[str]  # a list while built, Names when loaded
    owners: list[str]
    owner_of: array
    states: list[str]
    state_of: array
    starts: array
    ends: array
    notable: dict[int, tuple[str | None, bool, str | None]]  # place -> held, held_shared, wants_shared
    released: Sequence[str]
    released_by: array

    @classmethod
    def empty(cls) -> Columns:
        return cls([], [], array(_UINT32), [], array(_UINT32), array(_UINT32), array(_UINT32), {}, [], array(_UINT32))

    def packed(self) -> tuple:
        return (*Names.packed(self.ids), self.owners, _packed(self.owner_of), self.states, _packed(self.state_of),
                _packed(self.starts), _packed(self.ends), self.notable, *Names.packed(self.released),
                _packed(self.released_by))

    @classmethod
    def unpacked(cls, stored: tuple) -> Columns | None:
        """The columns as stored (`packed`); None unless they are whole and consistent."""
        ids_text, id_starts, owners, owner_of, states, state_of, starts, ends, notable, released_text, \
            released_starts, released_by = stored
        ids, released = Names.unpacked(ids_text, id_starts), Names.unpacked(released_text, released_starts)
        if ids is None or released is None:
            return None
        # The ids' order (bisect finds a job by it) is checked by verify (LazyState.decoded):
        # checking it here cost every reader 7 ms at 118,956 jobs.
        c = cls(ids, owners, _unpacked(owner_of), states, _unpacked(state_of), _unpacked(starts), _unpacked(ends),
                notable, released, _unpacked(released_by))
        n = len(c.ids)
        if not all(isinstance(x, list) for x in (owners, states)) or not isinstance(notable, dict) \
                or any(len(col) != n for col in (c.owner_of, c.state_of, c.starts, c.ends)) \
                or len(c.released_by) != len(released) \
                or not all(map(operator.le, c.released_by, itertools.islice(c.released_by, 1, None))):
            return None
        if not (codes_below(owner_of, len(owners)) and codes_below(state_of, len(states))):
            return None
        if any(not (isinstance(i, int) and 0 <= i < n and isinstance(v, tuple) and len(v) == 3) for i, v in notable.items()) \
                or (released_by and c.released_by[-1] >= n):  # in place order: the last is the largest
            return None
        return c


_SEP = "\0"  # no job id nor TPU name holds it (ledger.spec.names); Names.packed refuses one that would


class Names(Sequence[str]):
    """A long list of names (a snapshot's ids, its latest releases) kept as one text, each
    name followed by a separator, and where each starts: a name is made a str when asked,
    so a reader that bisects for a few ids never splits all 119k (unpickling them as a list
    took 19 ms, splitting the text 11). Iterating splits it, and so does the 4,096th lookup
    by place (~240 bisects, ~3 ms): a reader asking for many jobs splits once."""

    __slots__ = ("_text", "_starts", "_asked", "_list")
    _SPLIT_AFTER = 4_096  # lookups by place (0.6 us each; a bisect of 119k makes 17)

    def __init__(self, text: str, starts: array) -> None:
        self._text, self._starts = text, starts  # len(starts) == len(self) + 1
        self._asked = 0
        self._list: list[str] | None = None

    @staticmethod
    def packed(names: Sequence[str]) -> tuple[str, bytes]:
        text = "".join(name + _SEP for name in names)
        if text.count(_SEP) != len(names):
            raise ValueError("a job id or TPU name holds a NUL character: it cannot be kept in a snapshot")
        return text, _packed(itertools.accumulate((len(n) + 1 for n in names), initial=0))

    @classmethod
    def unpacked(cls, text: Any, starts: Any) -> Names | None:
        """None unless `text` and `starts` are a packed list of names."""
        if not isinstance(text, str) or not isinstance(starts, bytes) or len(starts) % 4:
            return None
        at = _unpacked(starts)
        if not at or at[0] != 0 or at[-1] != len(text) or text.count(_SEP) != len(at) - 1:
            return None
        return cls(text, at)

    def __len__(self) -> int:
        return len(self._starts) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if self._list is not None:
            return self._list[i]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        self._asked += 1
        if self._asked > self._SPLIT_AFTER:
            self._list = self._text.split(_SEP)[:-1]
            return self._list[i]
        if i < 0:
            i += len(self)
            if i < 0:
                raise IndexError(i)
        return self._text[self._starts[i]:self._starts[i + 1] - 1]  # past the end: IndexError

    def __iter__(self) -> Iterator[str]:
        return iter(self._list if self._list is not None else self._text.split(_SEP)[:-1])

    def consistent(self) -> bool:
        """Each name starts where the text's separators say (verify: lookups by place use
        the starts, iteration the separators)."""
        return list(itertools.accumulate((len(n) + 1 for n in self._text.split(_SEP)[:-1]), initial=0)) \
            == self._starts.tolist()

    def sorted_list(self) -> Sequence[str]:
        """What to bisect: the names split, once they are (a bisect of a list runs at C
        speed, 17x faster than through __getitem__), else these."""
        return self._list if self._list is not None else self


def place(names: Sequence[str], name: str) -> int | None:
    """Where `name` is in `names` (in order), None if it is not."""
    if isinstance(names, Names):
        names = names.sorted_list()
    i = bisect.bisect_left(names, name)
    return i if i < len(names) and names[i] == name else None


def codes_below(data: bytes, n: int) -> bool:
    """Every code in `data` (packed, `_packed`) is below `n`. A lab has fewer than 256 owners
    and states: then each code's three high bytes are 0 and its low byte one of range(n),
    checked at C speed (max() over 119k codes took 5 ms a column)."""
    if not isinstance(data, bytes):
        return False
    if n > 256:
        return not data or max(_unpacked(data)) < n
    high = data[1::4] + data[2::4] + data[3::4]
    return high.count(0) == len(high) and not data[0::4].translate(None, bytes(range(n)))


class ColumnsBuilder:
    """Columns made job by job, in id order, as the encoding walks (ledger.snapshots.jobs)."""

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._released: list[str] = []
        self.c = Columns.empty()._replace(ids=self._ids, released=self._released)
        self._owner: dict[str, int] = {}
        self._state: dict[str, int] = {}

    def add(self, entry: JobIndex, start: int, end: int) -> None:
        c, i = self.c, len(self._ids)
        self._ids.append(entry.id)
        c.owner_of.append(_code(self._owner, c.owners, entry.owner))
        c.state_of.append(_code(self._state, c.states, entry.state))
        c.starts.append(start)
        c.ends.append(end)
        if entry.held is not None or entry.wants_shared is not None:
            c.notable[i] = (entry.held, entry.held_shared, entry.wants_shared)
        for name in entry.released:
            self._released.append(name)
            c.released_by.append(i)


def code_in(values: list[str], value: str | None) -> int | None:
    """`value`'s code in a column's distinct `values`: None for no value asked, -1 when no
    job has it."""
    if value is None:
        return None
    return values.index(value) if value in values else -1


def _code(codes: dict[str, int], values: list[str], value: str) -> int:
    code = codes.get(value)
    if code is None:
        code = codes[value] = len(values)
        values.append(value)
    return code
