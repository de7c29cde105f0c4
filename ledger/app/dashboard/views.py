"""What each page shows, from the live state and the store: plain data for the templates and
for `/api/`. The shapes of the CLI's `--json` come from `ledger.app.readmodels`,
`ledger.app.commands.usage.usage_json` and `Event.to_dict()` (the events `ledger inspect --json`
prints), so a script and a page read the same answer.

Everything a user can put in a URL is checked here first: ids are looked up, never used as
paths; filters are bounded in length; page numbers are whole numbers within range.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar
from urllib.parse import quote, urlencode

import yaml

from ledger import defaults
from ledger.app.dashboard import charts, timeline
from ledger.app.dashboard.live import LiveLedger, VerifyRun
from ledger.app.dashboard.weeks import week_table
from ledger.app.queueview import queue_rows, queue_summary, recorded_policy, share_rows
from ledger.app.readmodels import (
    SORTS,
    JobCard,
    accelerator_of,
    job_json,
    select_jobs,
    tpu_rows,
    usage_json,
)
from ledger.describe import actor_text, summarize
from ledger.events import Event, format_time
from ledger.fold import LIVE, TERMINAL
from ledger.replay import SNAPSHOT_NAME
from ledger.snapshots.jobs import code_version
from ledger.store import Store
from ledger.usage import GROUPINGS, from_us
from reconciler import admission
from reconciler.joblogs import LogView
from reconciler.joblogs.view import output_name
from reconciler.plan import shared_lines

PER_PAGE = 100
MAX_PER_PAGE = 500
EVENTS_PER_PAGE = 200
MAX_TEXT = 200  # longest filter value taken from a URL
MAX_ID = 300  # longest stream name the store accepts (ledger.store.base.check_stream)
LOG_TAIL_BYTES = 16_384
WEEKS_SHOWN = 12
STATES = tuple(sorted(LIVE | TERMINAL))


class BadRequest(ValueError):
    """A query the dashboard refuses (HTTP 400), with a message safe to show."""


class NotFound(LookupError):
    """No such job (HTTP 404)."""


def _text(params: Mapping[str, str], name: str) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if len(value) > MAX_TEXT or not value.isprintable():
        raise BadRequest(f"{name} must be printable and at most {MAX_TEXT} characters")
    return value


def _number(params: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    value = params.get(name)
    if value is None or value == "":
        return default
    if not value.isdigit() or len(value) > 9:
        raise BadRequest(f"{name} must be a whole number from {lo} to {hi}")
    return min(max(int(value), lo), hi)


@dataclass(frozen=True, slots=True)
class JobQuery:
    owner: str | None = None
    state: str | None = None
    accelerator: str | None = None
    text: str | None = None
    sort: str = "id"
    descending: bool = False
    page: int = 1
    per_page: int = PER_PAGE

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> JobQuery:
        state = _text(params, "state")
        if state is not None and state not in STATES:
            raise BadRequest(f"state must be one of {', '.join(STATES)}")
        sort = _text(params, "sort") or "id"
        if sort not in SORTS:
            raise BadRequest(f"sort must be one of {', '.join(SORTS)}")
        order = _text(params, "order") or "asc"
        if order not in ("asc", "desc"):
            raise BadRequest("order must be asc or desc")
        return cls(_text(params, "owner"), state, _text(params, "accelerator"), _text(params, "q"), sort,
                   order == "desc", _number(params, "page", 1, 1, 10**9),
                   _number(params, "per_page", PER_PAGE, 1, MAX_PER_PAGE))

    def url(self, path: str = "/jobs", **changes: Any) -> str:
        """This query with some parts changed, as a link (defaults left out)."""
        q = replace(self, **changes)
        return _link(path, {"owner": q.owner, "state": q.state, "accelerator": q.accelerator, "q": q.text,
                            "sort": q.sort if q.sort != "id" else None, "order": "desc" if q.descending else None,
                            "page": q.page, "per_page": q.per_page})


def _link(path: str, params: Mapping[str, Any]) -> str:
    """`path` with the query's parameters that are set, the first page and the default
    page size left out."""
    kept = {k: v for k, v in params.items()
            if v is not None and not (k == "page" and v == 1) and not (k == "per_page" and v == PER_PAGE)}
    return f"{path}?{urlencode(kept)}" if kept else path


@dataclass(frozen=True, slots=True)
class QueueQuery:
    """Which waiting jobs the queue page shows: an owner's, those waiting for one reason
    (`wait`: admitted, quota, capacity, ...), a page of them."""

    owner: str | None = None
    wait: str | None = None
    page: int = 1
    per_page: int = PER_PAGE
    PARAMS: ClassVar[tuple[str, ...]] = ("owner", "wait", "page", "per_page")

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> QueueQuery:
        return cls(_text(params, "owner"), _text(params, "wait"), _number(params, "page", 1, 1, 10**9),
                   _number(params, "per_page", PER_PAGE, 1, MAX_PER_PAGE))

    def url(self, path: str = "/queue", **changes: Any) -> str:
        q = replace(self, **changes)
        return _link(path, {"owner": q.owner, "wait": q.wait, "page": q.page, "per_page": q.per_page})


def addressable(job_id: str) -> bool:
    """A stream the pages can link to: owner/name, one slash, both parts present (every id
    the watcher makes). Other streams are listed, never linked."""
    owner, slash, name = job_id.partition("/")
    return bool(owner and slash and name and "/" not in name and len(job_id) <= MAX_ID and job_id.isprintable())


def job_href(job_id: str) -> str | None:
    """The job page's path, each part percent-encoded; None for a stream no page shows."""
    if not addressable(job_id):
        return None
    owner, _, name = job_id.partition("/")
    return f"/jobs/{quote(owner, safe='')}/{quote(name, safe='')}"


def _summary_row(c: JobCard) -> dict[str, Any]:
    return {"id": c.id, "owner": c.owner, "name": c.name, "state": c.state or "-", "accelerator": c.accelerator,
            "attempt": c.attempt, "restarts": c.restarts, "tpu": c.tpu, "changed": c.changed, "reason": c.reason}


def jobs_page(live: LiveLedger, query: JobQuery) -> dict[str, Any]:
    """One page of jobs, plus what the filters can choose from. `jobs` is `ledger list
    --json`'s shape for the page's jobs; `rows` the table's cells."""
    with live.lock:
        # Made once per position: visits between two events share it (at 118,956 jobs ~15 ms a
        # visit then, ~40 ms for the first after an event: the settled jobs' part is kept).
        listing = live.cached("jobs", live.position, live.listing)
        cards = listing.cards
        chosen = select_jobs(cards, owner=query.owner, state=query.state, accelerator=query.accelerator,
                             text=query.text, sort=query.sort, descending=query.descending)
        pages = max(1, -(-len(chosen) // query.per_page))
        page = min(query.page, pages)
        shown = chosen[(page - 1) * query.per_page: page * query.per_page]
        return {
            "position": live.position, "total": len(chosen), "all": len(cards), "page": page, "pages": pages,
            "per_page": query.per_page, "offset": (page - 1) * query.per_page,
            "jobs": [job_json(live.jobs.find(c.id)) for c in shown], "rows": [_summary_row(c) for c in shown],
            "states": sorted((s, n) for s, n in listing.states.items() if s), "owners": sorted(listing.owners),
            "accelerators": sorted(a for a in listing.accelerators if a),
        }


def require_job(live: LiveLedger, job_id: str) -> None:
    """NotFound (404) unless the live state knows the job; copies nothing."""
    if len(job_id) > MAX_ID:
        raise NotFound(job_id)
    with live.lock:
        if job_id not in live.jobs:
            raise NotFound(job_id)


def job_state(live: LiveLedger, job_id: str) -> dict[str, Any]:
    return _job_json(live, job_id)[0]


def _job_json(live: LiveLedger, job_id: str) -> tuple[dict[str, Any], str]:
    """The job's `ledger list --json` state and its accelerator, read under one lock."""
    if len(job_id) > MAX_ID:
        raise NotFound(job_id)
    with live.lock:
        job = live.jobs.find(job_id)
        if job is None:
            raise NotFound(job_id)
        return job_json(job), accelerator_of(job)


def who(events: Sequence[Event]) -> dict[str, Any] | None:
    """Who asked for the job as it runs now, who approved it, and the commit that merged it:
    from its latest `submitted` or `spec_updated` (the watcher's record of the commit)."""
    for e in reversed(events):
        if e.type in ("submitted", "spec_updated"):
            d, a = e.data, e.actor
            return {
                "type": e.type, "seq": e.seq, "time": e.time,
                "author": d.get("author_name") or a.get("name") or "", "author_email": d.get("author") or a.get("email") or "",
                "approvers": list(d.get("approvers") or a.get("approvers") or []),
                "pr": d.get("pr", a.get("pr")), "commit": str(d.get("commit") or a.get("commit") or ""),
                "path": d.get("path", ""), "actor": actor_text(a),
                "committed_at": format_time(from_us(int(d["committed_at"]) * 1_000_000))
                if type(d.get("committed_at")) is int else "",
            }
    return None


def chain_status(e: Event, verified: VerifyRun | None) -> tuple[str, str]:
    """(status, explanation) of one event in the hash chain: its hash recomputed from its
    content, and whether the dashboard's last `verify` covered it."""
    if e.expected_hash() != e.hash:
        return "broken", "its hash does not match its content"
    if verified is None or verified.report is None:
        return "sealed", "its hash matches its content; the chain has not been verified yet"
    if e.seq <= verified.verified_head:
        return "verified", f"in the chain verified at {verified.started} (up to seq {verified.verified_head})"
    problem = verified.report.get("problem")
    if problem:
        return "unverified", f"after the problem verify found at seq {problem['position']}: {problem['reason']}"
    return "sealed", f"its hash matches its content; appended after the last verify (up to seq {verified.verified_head})"


def log_tail(logs: LogView | None, job_id: str, attempt: int | None = None, worker: int = 0) -> dict[str, Any]:
    """The end of worker `worker`'s output in the latest attempt with logs (`ledger logs`'
    files: the collected archive and the log directory, whichever reconciler fetched them).
    Ids are escaped into path segments by `layout`, so no id reaches outside them."""
    out: dict[str, Any] = {"worker": worker, "attempt": None, "attempts": [], "path": None, "text": "", "truncated": False}
    if logs is None:
        return out
    found = logs.files(job_id)
    out["attempts"] = list(found)
    if not found:
        return out
    chosen = attempt if attempt in found else max(found)
    log = found[chosen].get(output_name(worker))
    out["attempt"] = chosen
    if log is None:
        return out
    out["path"] = f"{log.source.where}/{log.key}"
    start = max(0, log.size - LOG_TAIL_BYTES)
    data = log.read(start, LOG_TAIL_BYTES)
    if start > 0:
        data = data.split(b"\n", 1)[-1]  # from the first whole line
        out["truncated"] = True
    out["text"] = data.decode("utf-8", errors="replace")
    return out


def job_page(live: LiveLedger, store: Store, job_id: str, *, events_page: int | None = None,
             logs: LogView | None = None) -> dict[str, Any]:
    """Everything the job page shows: state, who, spec, timeline picture, events (a page of
    them, the latest by default) with their chain status, the log's tail."""
    state, accelerator = _job_json(live, job_id)
    events = store.read_stream(job_id)
    if not events:
        raise NotFound(job_id)
    now = live.now_us()
    line = timeline.build(events, now)
    verified = live.last_verify
    pages = max(1, -(-len(events) // EVENTS_PER_PAGE))
    page = pages if events_page is None else min(max(events_page, 1), pages)
    shown = events[(page - 1) * EVENTS_PER_PAGE: page * EVENTS_PER_PAGE]
    rows = []
    for e in shown:
        status, why = chain_status(e, verified)
        rows.append({"seq": e.seq, "time": e.time, "type": e.type, "actor": actor_text(e.actor),
                     "summary": summarize(e.type, e.data), "chain": status, "chain_text": why,
                     "bookkeeping": e.type in timeline.UNDRAWN})
    spec = state.get("spec") or {}
    return {
        "job": state, "id": job_id, "position": live.position, "who": who(events),
        "spec_yaml": yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, width=100) if spec else "",
        "timeline": line, "picture": timeline.draw(line), "events": rows, "count": len(events),
        "events_page": page, "events_pages": pages, "verify": verified,
        "log": log_tail(logs, job_id), "accelerator": accelerator,
    }


def tpus_page(live: LiveLedger) -> dict[str, Any]:
    """`ledger tpus --json`'s rows, and each shared TPU with its holder and its line."""
    with live.lock:
        jobs = live.state.jobs
        rows = tpu_rows(jobs.values(), live.health.checks)
        shared: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r["shared"]:
                entry = shared.setdefault(r["tpu"], {"tpu": r["tpu"], "zone": r["zone"], "accelerator": r["accelerator"],
                                                     "holder": None, "line": []})
                if not r["job_state"].startswith("waiting"):
                    entry["holder"] = r
        lines = shared_lines(jobs) if shared else {}
        for name, entry in shared.items():
            entry["line"] = [{"job": j.id, "owner": j.owner, "state": j.state, "priority": j.priority,
                              "reason": j.queued_reason, "since": j.times.get("queued", "")}
                             for j in lines.get(name, [])]
        held = [r for r in rows if not r["job_state"].startswith("waiting")]
        return {"position": live.position, "rows": rows, "held": held, "shared": [shared[k] for k in sorted(shared)],
                "chips": sum(r["chips"] for r in held)}


def queue_page(live: LiveLedger, store: Store) -> dict[str, Any]:
    """`ledger queue --json`'s rows (waiting jobs in admission order, why each waits) and
    `ledger queue --tree --json`'s fair tree, under the sharing rules the ledger records,
    from the live state and its usage."""
    # The answer moves with the ledger (the recorded policy too is an event) and, between
    # events, only with the clock (fair share and the week drift): made once per position
    # and FAIR_SHARE_REFRESH_S, as the reconciler plans (10,000 waiting jobs: ~0.2 s each).
    key = (live.position, int(live.now_us() // (defaults.FAIR_SHARE_REFRESH_S * 1_000_000)))
    return live.cached("queue", key, lambda: _queue_page(live, store))


def queue_shown(data: dict[str, Any], query: QueueQuery) -> dict[str, Any]:
    """One page of `queue_page`'s rows, chosen by `query`, with the total it was cut from:
    a lab's 10,000 waiting jobs are 5.7 MB of HTML, pages of 100 are what a reader reads
    (`/api/queue` still answers every row)."""
    chosen = [r for r in data["rows"]
              if (query.owner is None or r["owner"] == query.owner) and (query.wait is None or r["wait"] == query.wait)]
    pages = max(1, -(-len(chosen) // query.per_page))
    page = min(query.page, pages)
    return {"rows": chosen[(page - 1) * query.per_page: page * query.per_page], "total": len(chosen),
            "all": len(data["rows"]), "page": page, "pages": pages, "offset": (page - 1) * query.per_page,
            "owners": sorted({r["owner"] for r in data["rows"]})}


def _queue_page(live: LiveLedger, store: Store) -> dict[str, Any]:
    policy = recorded_policy(store)
    usage = live.recent_usage(policy, store)
    with live.lock:
        rows = queue_rows(store, policy, live.state.jobs, usage, live.capacity)
        tree = share_rows(policy, live.state.jobs, usage)
        position = live.position
    summary = queue_summary(rows)
    return {"position": position, "rows": rows, "counts": sorted(summary["by_wait"].items()), "tree": tree,
            "oldest": summary["oldest_since"], "policy": policy is not None and admission.active(policy)}


def usage_page(live: LiveLedger, by: str = "owner") -> dict[str, Any]:
    """`ledger usage --json` as it stands now (no window, no prices), the charts' geometry,
    and the weekly table."""
    if by not in GROUPINGS or by == "attempt":
        raise BadRequest(f"by must be one of {', '.join(g for g in GROUPINGS if g != 'attempt')}")
    live.wait_for_usage()
    now = live.now_us()
    # Made once per position and second (the page tells times to the second): a lab's
    # 10,000 open intervals took ~70-130 ms a visit, the page and /api/usage alike.
    return live.cached(f"usage by {by}", (live.position, now // 1_000_000), lambda: _usage_page(live, by, now))


def _usage_page(live: LiveLedger, by: str, now: int) -> dict[str, Any]:
    with live.lock:
        opened = live.usage.open_intervals(now)  # 10,000 waiting jobs' intervals: made once for both
        # The closed accounts' sums are kept from one visit to the next: only the open
        # accounts are copied and priced, and only those closed since are added.
        report = live.rollup(by).report_of(live.usage, now, opened)
        owners = live.rollup("owner").report_of(live.usage, now, opened) if by != "owner" else report
        weeks = week_table(live.usage.weeks or {}, opened, last=WEEKS_SHOWN)
        position = live.usage.position
    return {
        "report": usage_json(report, None, format_time(from_us(now)), position, live.usage.prices.in_force()),
        "rows": report.rows,
        "total": report.total, "by": by, "owner_chart": charts.owner_bars(owners.rows),
        "week_chart": charts.week_columns(weeks), "weeks": weeks, "position": position,
    }


def health_page(live: LiveLedger, store: Store, store_label: str) -> dict[str, Any]:
    """The ledger's head, the last verify, the publisher's lag, the newest snapshot."""
    head = store.head()
    last = next(iter(store.read_all(head - 1, limit=1)), None) if head else None
    # The one replay would start from (this code's): a listing would fetch every stored
    # snapshot whole, ~150 MB at 118,956 jobs, at every visit.
    newest = store.load_snapshot(SNAPSHOT_NAME, code_version(), at_most=head)
    verify = live.last_verify
    return {
        "store": store_label, "head": head, "head_hash": last.hash if last else None,
        "head_time": last.time if last else None, "folded": live.position, "tail_error": live.tail_error,
        # usage is folded behind the pages at start on a large ledger (LiveLedger._catch_up)
        "usage_folded": live.position if live.usage_ready.is_set() else live.usage_read,
        "usage_ready": live.usage_ready.is_set(),
        "loaded_in": round(live.loaded_in, 3), "jobs": live.job_count(),
        "verify": verify.to_dict() if verify else None, "verifying": live.verifying,
        "verify_every": live.verify_every, "publisher": live.publisher(store),
        "snapshot": {"position": newest.position, "code": newest.code_version} if newest else None,
    }


_SECRET = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@]*):[^@/]*@")


def redact(url: str) -> str:
    """A store URL fit to show: a password in it becomes ***."""
    return _SECRET.sub(r"\g<scheme>\g<user>:***@", url)
