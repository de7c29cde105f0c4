"""Answers to the ledger's questions, shaped once for every reader: the CLI's `--json` and the
dashboard's pages and `/api/` call these, so a script and a page never disagree.

Pure functions over the fold's states (`ledger.fold.JobState`); no I/O.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import msgspec

from ledger.defaults import RELEASE_REFUSED_RETRY_S
from ledger.fold import JobState
from ledger.placement import accelerator_of, held, slice_nodes
from ledger.snapshots.columns import JobIndex, choose
from ledger.usage import CATEGORIES, UsageReport


def job_json(job: JobState) -> dict[str, Any]:
    """One job's state as `ledger list --json` and `ledger replay --json` print it.

    `times` is copied: it is the one field the fold edits in place, and a reader that
    encodes the answer later (the dashboard, while its tail folds new events) must not
    see it change under its feet."""
    out = job.to_dict()
    out["times"] = dict(job.times)
    return out


def tpu_rows(jobs: Iterable[JobState], health: Mapping[str, Mapping[str, str]] | None = None) -> list[dict[str, Any]]:
    """`ledger tpus --json`: every TPU a job holds (one row per slice: a multislice job's
    queued resource `name` holds nodes `name-0` .. `name-(N-1)`), and every shared TPU a live
    job waits for, in job id order; `chips` of that row's slice, `placement` the job's choice
    it is (0: the `tpu` block); `health` and `checked`: its hosts' health at the last host
    check and when (`TpuHealth`; "" when never checked)."""
    health = health or {}
    rows = []
    for job in sorted(jobs, key=lambda j: j.id):
        if job.tpu:
            since = job.times.get("provisioned") or job.times.get("provisioning", "")
            fp = held(job.tpu)
            slices = slice_nodes(job.tpu)
            for s, node in enumerate(slices):
                rows.append({"tpu": node, "zone": job.tpu.get("zone"), "accelerator": job.tpu.get("accelerator"),
                             "shared": bool(job.tpu.get("shared")), "job": job.id, "owner": job.owner,
                             "job_state": job.state, "since": since, "chips": fp.chips_per_slice if fp else 0,
                             "pricing": job.tpu.get("pricing") or (job.spec.get("tpu") or {}).get("pricing", ""),
                             "placement": job.tpu.get("placement", 0), "slice": s, "slices": len(slices),
                             "queued_resource": job.tpu.get("name") if len(slices) > 1 else None})
        elif not job.terminal and (want := job.spec.get("tpu") or {}).get("shared"):
            fp = held(want)
            rows.append({"tpu": want.get("name"), "zone": want.get("zone"), "accelerator": want.get("accelerator"),
                         "shared": True, "job": job.id, "owner": job.owner, "job_state": f"waiting ({job.state})",
                         "since": job.times.get("queued", ""), "chips": fp.chips if fp else 0,
                         "pricing": want.get("pricing", ""), "placement": 0, "slice": 0, "slices": 1, "queued_resource": None})
        else:
            continue
    for row in rows:
        check = health.get(row["tpu"] or "", {})
        row.update(health=check.get("health", ""), checked=check.get("time", ""))
    return rows


class TpuHealth:
    """TPU name -> {"health", "time"} of the last host check on it (reconciler.doctor): the
    health a `started` event carries, a start refused as `host_unhealthy`, or the result of
    a `clean` (the checks' repairs). Fed in ledger order, events or store rows alike, so the
    CLI (over the events it read) and the dashboard (over its tail) fold it the same way."""

    TYPES = frozenset({"provisioning", "provisioned", "started", "failed", "action_outcome", "released"})

    def __init__(self) -> None:
        self.on: dict[str, str] = {}  # job stream -> the TPU it holds
        self.checks: dict[str, dict[str, str]] = {}

    def add(self, stream: str, type_: str, time: str, d: Mapping[str, Any]) -> None:
        if type_ in ("provisioning", "provisioned") and isinstance(d.get("tpu"), dict):
            self.on[stream] = str(d["tpu"].get("name", ""))
        elif type_ == "released":
            # Bounded by what is held: a TPU of the job's own is gone with its release (each
            # attempt gets a new name); a shared one lives on, and keeps its last check.
            name = self.on.pop(stream, "")
            tpu = d.get("tpu")
            if name and not (isinstance(tpu, dict) and tpu.get("shared")):
                self.checks.pop(name, None)
        elif type_ == "started" and d.get("health") and self.on.get(stream):
            self.checks[self.on[stream]] = {"health": str(d["health"]), "time": time}
        elif type_ == "failed" and d.get("kind") == "host_unhealthy" and self.on.get(stream):
            self.checks[self.on[stream]] = {"health": "unhealthy", "time": time}
        elif type_ == "action_outcome" and d.get("action") == "clean" and isinstance(d.get("result"), dict):
            name = str(d["result"].get("tpu") or self.on.get(stream, ""))
            if name:
                self.checks[name] = {"health": str(d["result"].get("health", "")), "time": time}

    def tee(self, rows: Iterable[tuple]) -> Iterator[tuple]:
        """Pass store rows (seq, stream, version, type, time, data JSON) through, folding the
        few types that matter on the way (the dashboard folds usage from the same read)."""
        types, add = self.TYPES, self.add
        for row in rows:
            if row[3] in types:
                data = row[5]
                add(row[1], row[3], row[4], msgspec.json.decode(data) if isinstance(data, str | bytes) else data)
            yield row


def tpu_health_of_rows(rows: Iterable[tuple]) -> TpuHealth:
    """`TpuHealth` over store rows in ledger order (`ledger tpus` and the dashboard's start
    read the holders' streams' rows of `TpuHealth.TYPES` in one query: store.stream_rows,
    `health_streams`)."""
    fold = TpuHealth()
    for _ in fold.tee(rows):
        pass
    return fold


def tpu_health(events: Iterable[Any]) -> dict[str, dict[str, str]]:
    """`TpuHealth` over events in ledger order."""
    fold = TpuHealth()
    for e in events:
        if e.type in fold.TYPES:
            fold.add(e.stream, e.type, e.time, e.data or {})
    return fold.checks


def health_streams(holders: Iterable[JobIndex], releasing: Callable[[set[str]], Iterable[str]]) -> set[str]:
    """The job streams whose events say the last host check of every TPU `tpu_rows` lists:
    `ledger tpus` reads these (besides the jobs' state from snapshot and tail), not the
    whole ledger. A TPU of a job's own is checked only in its holder's stream (each attempt
    gets a new name); a shared TPU in the stream of any job that held it, so every job that
    asks for it, or released it lately (`releasing`: the ids of the jobs whose latest
    releases, `JobState.released`, name one of the TPUs), is read. Chosen from the index of
    the jobs that hold a TPU or ask for a shared one (`snapshots.lazy.LazyState.holders`): no job's
    state is decoded for it."""
    holders = list(holders)
    streams: set[str] = set()
    shared: set[str] = set()
    for job in holders:
        if job.held is not None:
            streams.add(job.id)
            if job.held_shared:
                shared.add(job.held)
        elif not job.terminal and job.wants_shared is not None:
            shared.add(job.wants_shared)
    if shared:
        streams.update(job.id for job in holders if job.wants_shared in shared)
        streams.update(releasing(shared))
    return streams


def tpu_jobs(jobs: Iterable[JobIndex]) -> list[str]:
    """The jobs `tpu_rows` shows a row of: those holding a TPU, and live ones waiting for a
    shared one (in id order). Chosen from the index (`snapshots.lazy.LazyState.holders` gives all
    such jobs and a few more), so only these are decoded."""
    return sorted(j.id for j in jobs if j.held is not None or (not j.terminal and j.wants_shared is not None))


def placements_of(events: Iterable[Any]) -> list[dict[str, Any]]:
    """Where every attempt of a job ran: one entry per TPU it was given (`provisioning`),
    with its choice (0: the `tpu` block), type, slices, pricing and zone, and when. What
    `ledger inspect` and the dashboard's timeline show."""
    out = []
    for e in events:
        tpu = e.data.get("tpu") if e.type == "provisioning" else None
        if isinstance(tpu, Mapping) and not tpu.get("shared"):
            out.append({"attempt": e.data.get("attempt"), "time": e.time, "choice": tpu.get("placement", 0),
                        "accelerator": tpu.get("accelerator"), "slices": tpu.get("slices", 1), "pricing": tpu.get("pricing"),
                        "zone": tpu.get("zone"), "tpu": tpu.get("name"), "how": e.data.get("how")})
    return out


def placement_label(p: Mapping[str, Any]) -> str:
    """`attempt 2: 2 x v5litepod-16 spot us-west4-a (choice 1)`."""
    size = f"{p['slices']} x " if (p.get("slices") or 1) > 1 else ""
    where = " ".join(str(x) for x in (f"{size}{p.get('accelerator') or '?'}", p.get("pricing"), p.get("zone")) if x)
    return f"attempt {p.get('attempt', '?')}: {where}" + (f" (choice {p['choice']})" if p.get("choice") else "")


def last_change(job: JobState) -> str:
    """When the job's latest event happened (ISO UTC), '' for none."""
    return max(job.times.values()) if job.times else ""


class JobCard(NamedTuple):
    """What the dashboard's jobs page chooses, orders and lists a job by (`select_jobs`,
    its table's row), made once for a settled job: a lab's history of them is listed without
    holding their states (the dashboard keeps those packed, ledger.shelf)."""

    id: str
    owner: str
    name: str
    state: str
    accelerator: str  # accelerator_of
    tpu: str  # the TPU held's name, '' for none
    changed: str  # last_change
    attempt: int
    restarts: int
    submitted: int  # submitted_seq
    reason: str  # queued_reason


def card_of(job: JobState) -> JobCard:
    return JobCard(job.id, job.owner, job.name, job.state, accelerator_of(job),
                   str(job.tpu.get("name", "")) if isinstance(job.tpu, dict) else "", last_change(job),
                   job.attempt, job.restarts, job.submitted_seq, job.queued_reason)


class Listing(NamedTuple):
    """Cards in id order, with what the jobs page's filters offer: jobs per state, the owners
    and the accelerators (`of`). A lab's settled jobs keep theirs from one event to the next
    (their shelf changes when jobs settle), the live ones' is made at each: `merged`."""

    cards: list[JobCard]
    states: dict[str, int]
    owners: frozenset[str]
    accelerators: frozenset[str]

    @classmethod
    def of(cls, cards: Iterable[JobCard]) -> Listing:
        chosen = sorted(cards, key=SORTS["id"])
        states: dict[str, int] = {}
        for c in chosen:
            states[c.state] = states.get(c.state, 0) + 1
        return cls(chosen, states, frozenset(c.owner for c in chosen), frozenset(c.accelerator for c in chosen))

    def merged(self, other: Listing) -> Listing:
        """Both, in id order (two sorted runs: one merge, not a sort of them all)."""
        cards = self.cards + other.cards
        cards.sort(key=SORTS["id"])
        states = dict(self.states)
        for state, n in other.states.items():
            states[state] = states.get(state, 0) + n
        return Listing(cards, states, self.owners | other.owners, self.accelerators | other.accelerators)


# How `select_jobs` can order jobs: name -> key. Ties are broken by id, so a page is stable.
SORTS: dict[str, Callable[[JobCard], Any]] = {
    "id": operator.attrgetter("id"),
    "owner": operator.attrgetter("owner"),
    "state": operator.attrgetter("state"),
    "accelerator": operator.attrgetter("accelerator"),
    "attempt": operator.attrgetter("attempt"),
    "restarts": operator.attrgetter("restarts"),
    "changed": operator.attrgetter("changed"),
    "submitted": operator.attrgetter("submitted"),
}


def select_jobs(cards: Iterable[JobCard], *, owner: str | None = None, state: str | None = None,
                accelerator: str | None = None, text: str | None = None, sort: str = "id",
                descending: bool = False) -> list[JobCard]:
    """The jobs the dashboard's jobs page lists (by their cards, `card_of`): filtered by
    owner, state, accelerator and a case-insensitive search in the id, TPU and accelerator,
    then sorted (in `ledger list`'s order, by id, unless asked otherwise)."""
    needle = text.lower() if text else None
    chosen = [
        c for c in choose(cards, owner=owner, state=state)
        if (accelerator is None or c.accelerator == accelerator)
        and (needle is None or needle in c.id.lower() or needle in c.accelerator.lower() or needle in c.tpu.lower())
    ]
    if sort != "id" or descending:
        chosen.sort(key=SORTS[sort], reverse=descending)  # stable: ties stay in id order
    return chosen


def usage_json(report: UsageReport, since: str | None, until: str, position: int,
               prices: list[dict] | None = None) -> dict:
    """`ledger usage --json`: the report, the window it covers and the seq it stands at (the
    dashboard's usage page and /api/usage answer the same), and the prices in force at its
    end (`UsageFold.prices.in_force()`)."""
    return {"by": report.by, "since": since, "until": until, "position": position,
            "categories": list(CATEGORIES), "rows": [r.to_dict() for r in report.rows],
            "total": report.total.to_dict(), "missing_prices": list(report.missing),
            "prices_in_force": prices or []}


def release_refused(job: JobState | None) -> dict[str, Any] | None:
    """The TPU API refused for good to delete the TPU the job still holds: which TPU, and the
    one line that says what to grant (`last_error` of kind `release`); None otherwise."""
    if job is None or job.tpu is None or (job.last_error or {}).get("kind") != "release":
        return None
    return {"tpu": job.tpu.get("name", ""), **job.last_error}


def release_refused_line(refused: Mapping[str, Any]) -> str:
    """`release_refused`'s answer in words, as `ledger inspect` and `ledger list` say it."""
    return (f"{refused['message']} (TPU {refused['tpu']} keeps billing; tried again every "
            f"{int(RELEASE_REFUSED_RETRY_S // 60)} minutes)")
