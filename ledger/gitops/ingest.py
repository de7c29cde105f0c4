"""Ingest a branch's new commits into the ledger, exactly once.

The imperative shell around `decide`: read the position from `_git:<branch>`, list the new
first-parent commits, diff them in one `git diff-tree --stdin`, fetch the blobs in one
`git cat-file --batch`, decide, and append each chunk of commits in ONE transaction whose
`_git:<branch>` part carries an expected version. Two watchers racing: the loser's append
either finds every event already stored (ids come from commit, path and blob) or hits a
version conflict, re-reads the position and carries on from there.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ledger.errors import ConflictError, StoreError, UsageError
from ledger.events import NewEvent, actor
from ledger.events.data import (
    EventDataError,
    HistoryRewritten,
    Note,
    Quarantined,
    RewriteAccepted,
)
from ledger.fold import LIVE, replay
from ledger.forge.reviews import ReviewLookup
from ledger.forge.webflow import WEB_FLOW_PRINCIPAL, WebFlowKeys, verdict
from ledger.gitops.approval import Identity, Signature
from ledger.gitops.decide import Ignored, RepoState, StepInput, Verifier, decide, watcher_actor
from ledger.gitops.position import Position, fold_position, stream_for
from ledger.gitops.repo import ZERO, Change, Commit, GitError, GitRepo
from ledger.gitops.signed import committed_at, is_ssh, split_signed, ssh_verdict
from ledger.spec.config import load_repo_config
from ledger.spec.files import is_ignored, secrets_check
from ledger.spec.layout import ALIASES_PATH, JOBS_DIR, POLICY_PATH, is_governed, is_job_path
from ledger.spec.model import spec_hash
from ledger.spec.normalize import validate_text
from ledger.store import Store

Validator = Callable[[bytes, str, RepoState], Any]


@dataclass(slots=True)
class IngestReport:
    branch: str
    head: str | None = None  # the branch head that was read
    start: str | None = None  # last ingested commit before this run
    position: str | None = None  # last ingested commit after this run
    commits: int = 0  # commits this run appended
    skipped: int = 0  # commits another watcher had already ingested
    events: int = 0  # job/branch events appended (markers not counted)
    counts: dict[str, int] = field(default_factory=dict)  # event type -> number
    paused: bool = False
    rewritten: dict[str, Any] | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "branch": self.branch, "head": self.head, "start": self.start, "position": self.position,
            "commits": self.commits, "skipped": self.skipped, "events": self.events,
            "counts": dict(self.counts), "paused": self.paused, "rewritten": self.rewritten,
            "seconds": round(self.seconds, 4),
        }


@dataclass(frozen=True, slots=True)
class Sources:
    """Where approval evidence beyond the commit comes from: signatures (git and gpg) and
    a forge's reviews (None: no forge)."""

    verify: Verifier
    reviews: ReviewLookup | None = None


def read_position(store: Store, branch: str) -> Position:
    """The branch's position, reading only the stream's tail.

    Every `ingested` note carries everything the position needs, so the fold may start at
    the last one: read a small window back from the end and widen it until it holds one.
    """
    stream = stream_for(branch)
    version = store.stream_version(stream)
    window = 16
    while True:
        after = max(0, version - window)
        events = store.read_stream(stream, after_version=after)
        if after == 0 or any(e.type == "note" and e.data.get("kind") == "ingested" for e in events):
            return fold_position(events)
        window *= 4


def spec_validator() -> Validator:
    """Validate with `ledger.spec`, building the repo config once per approved configuration."""
    cache: dict[tuple, Any] = {}
    secrets = secrets_check()  # the secrets folder of the host the watcher runs on, if any

    def config_for(state: RepoState) -> Any:
        key = (state.files.get(ALIASES_PATH, ("",))[0], state.files.get(POLICY_PATH, ("",))[0])
        config = cache.get(key)
        if config is None:
            config = load_repo_config(aliases_text=state.text(ALIASES_PATH), policy_text=state.text(POLICY_PATH))
            cache.clear()
            cache[key] = config
        return config

    def validate(text: bytes, path: str, state: RepoState) -> Any:
        config = config_for(state)
        if is_ignored(path, config):
            return Ignored(path)
        return validate_text(text, path, config, secrets=secrets)

    # decide() asks this before cancelling: an ignored file never ran, so never cancels
    validate.ignored = lambda path, state: is_ignored(path, config_for(state))  # type: ignore[attr-defined]
    return validate


class _Liveness:
    """Is a job live now? Read from its stream once per run, then tracked in memory."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.known: dict[str, bool] = {}

    def __call__(self, job_id: str) -> bool:
        if job_id not in self.known:
            state = replay(self.store.read_stream(job_id)).jobs.get(job_id)
            # A job being cancelled (its spec was deleted) is not updated by a re-added spec:
            # the new file is a new submission.
            self.known[job_id] = state is not None and state.state in LIVE and not state.cancel_requested
        return self.known[job_id]


_STATES: dict[tuple, RepoState] = {}


def _load_state(repo: GitRepo, governing: dict[str, str]) -> RepoState:
    """The approved configuration named by blob ids (blobs never change: cache by id)."""
    key = (str(repo.git_dir), tuple(sorted(governing.items())))
    state = _STATES.get(key)
    if state is None:
        blobs = repo.read_blobs(governing.values())
        state = RepoState.of(governing, blobs)
        if len(_STATES) > 64:
            _STATES.clear()
        _STATES[key] = state
    return RepoState(dict(state.files))


def ingest(
    repo: GitRepo | str,
    store: Store,
    branch: str = "main",
    *,
    accept_rewrite: bool = False,
    accepted_by: str = "operator",
    chunk: int = 200,
    validator: Validator | None = None,
    web_flow: WebFlowKeys | None = None,
    reviews: ReviewLookup | None = None,
) -> IngestReport:
    """Append the events of every commit on `branch` after the ledger's position.

    Safe to run any number of times, concurrently, and after a crash at any point.
    A rewritten branch appends `history_rewritten` and stops (report.paused) until a run
    with `accept_rewrite=True`, which ingests the net change old head -> new head.
    A path is opened for this run and closed after it; a GitRepo stays open (the watcher's).
    `web_flow`: GitHub's keys for merges it signs (default: LEDGER_WEB_FLOW_KEYS or the
    shipped ones); `reviews`: a forge's pull request reviews (`ledger.forge`), if any.
    """
    if not isinstance(repo, GitRepo):
        with GitRepo(repo) as opened:
            return ingest(opened, store, branch, accept_rewrite=accept_rewrite, accepted_by=accepted_by,
                          chunk=chunk, validator=validator, web_flow=web_flow, reviews=reviews)
    started = time.perf_counter()
    report = IngestReport(branch)
    head = repo.branch_head(branch)
    if head is None:
        raise GitError(f"branch {branch!r} not found in {repo.path}", hint="check --branch and --repo")
    report.head = head
    validate = validator or spec_validator()
    sources = Sources(signature_verifier(repo, web_flow), reviews)
    stream = stream_for(branch)
    live = _Liveness(store)
    first = True
    backlog: list[Commit] = []  # listed once per run, consumed chunk by chunk
    conflicts = 0
    suspects: set[str] = set()  # commits of a chunk that failed: now ingested one at a time
    while True:
        pos = read_position(store, branch)
        if first:
            report.start, first = pos.commit, False
        report.position = pos.commit
        try:
            if pos.paused:
                if not accept_rewrite:
                    report.paused, report.rewritten = True, pos.rewritten
                    break
                old = pos.rewritten["old_head"]
                store.append(stream, [NewEvent(
                    "rewrite_accepted", RewriteAccepted(old_head=old, new_head=head, by=accepted_by),
                    actor("cli", accepted_by, branch=branch), key=f"accepted:{old}:{head}",
                )], expected_version=pos.version)
                continue
            if pos.accepted is not None:
                _ingest_rewrite(repo, store, branch, pos, validate, spec_hash, live, report, sources)
                continue
            if pos.commit == head:
                break
            done = next((i for i, c in enumerate(backlog) if c.sha == pos.commit), None)
            if done is not None:
                commits: list[Commit] | None = backlog[done + 1 :]
            else:
                commits = _new_commits(repo, pos.commit, head)
            if commits is None:
                data = HistoryRewritten(old_head=pos.commit, new_head=head, old_head_exists=repo.exists(pos.commit))
                store.append(stream, [NewEvent(
                    "history_rewritten", data, watcher_actor(branch), key=f"rewritten:{pos.commit}:{head}",
                )], expected_version=pos.version)
                continue
            if not commits:
                break
            backlog = commits
            size = 1 if commits[0].sha in suspects else chunk
            try:
                _ingest_commits(repo, store, branch, pos, commits[:size], validate, spec_hash, live, report, sources)
            except Exception as exc:
                if not is_data_problem(exc):
                    raise  # git or the store failed: the watcher retries later, with backoff
                if size > 1:
                    suspects.update(c.sha for c in commits[:size])  # find the one commit
                    continue
                _quarantine(store, branch, pos, commits[0], exc, report)
                live.known.clear()
        except ConflictError:
            # Another writer moved the branch stream on: re-read the position and go on from
            # there (its work is found done, never redone). Bounded so a bug cannot spin.
            conflicts += 1
            if conflicts > 100:
                raise
            live.known.clear()
            continue
    report.position = read_position(store, branch).commit
    report.seconds = time.perf_counter() - started
    return report


# Failures that come from what a commit holds, so retrying the same commit fails the same
# way: anything but git, the store and the operating system failing (those are retried).
_NOT_DATA = (ConflictError, GitError, OSError, MemoryError)


def is_data_problem(exc: BaseException) -> bool:
    if isinstance(exc, (UsageError, EventDataError)):
        return True  # e.g. a stream name or an event the store refuses: the commit's content
    if isinstance(exc, (StoreError, *_NOT_DATA)):
        return False
    return isinstance(exc, (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError,
                            UnicodeError, msgspec.MsgspecError))


def _quarantine(store: Store, branch: str, pos: Position, commit: Commit, exc: Exception, report: IngestReport) -> None:
    """Set aside a commit that cannot be ingested: one `quarantined` event (the notifier's
    alert) and the `ingested` marker that moves the position past it, in one transaction.
    The approved configuration stays what it was before the commit."""
    error = f"{type(exc).__name__}: {exc}"[:2000] or type(exc).__name__
    stream = stream_for(branch)
    events = [
        NewEvent("quarantined", Quarantined(commit=commit.sha, error=error, kind=type(exc).__name__),
                 watcher_actor(branch), key=f"quarantined:{pos.commit}:{commit.sha}", causation=f"git:{commit.sha}"),
        NewEvent("note", Note(kind="ingested", commit=commit.sha, base=pos.commit, governing=dict(pos.governing), events=1),
                 watcher_actor(branch), key=f"ingested:{pos.commit}:{commit.sha}", causation=f"git:{commit.sha}"),
    ]
    result = store.append(stream, events, expected_version=pos.version)
    if not result.duplicate:
        report.commits += 1
        report.events += 1
        report.counts["quarantined"] = report.counts.get("quarantined", 0) + 1


def _new_commits(repo: GitRepo, old: str | None, new: str) -> list[Commit] | None:
    """First-parent commits old..new, oldest first; None when `old` is not an ancestor."""
    try:
        commits = repo.first_parent_range(old, new)
    except GitError:
        return None  # the old head is gone from the repository: certainly rewritten
    # The common case costs no extra git process: the oldest new commit sits on the position.
    if old is None or (commits and commits[0].first_parent == old):
        return commits
    return commits if repo.is_ancestor(old, new) else None


def _authors(repo: GitRepo, commit: Commit, base: str | None) -> dict[str, tuple[Identity, ...]]:
    """path -> who wrote its change, for a merge: the authors of the merged commits that
    touched it (a plain commit's paths are its author's: decide knows that)."""
    if len(commit.parents) < 2 or not base:
        return {}
    return {p: tuple(Identity(n, e) for n, e in who) for p, who in repo.path_authors(base, commit.sha).items()}


def signature_verifier(repo: GitRepo, web_flow: WebFlowKeys | None = None) -> Verifier:
    """A commit's signature as the pure core reads it: an SSH signature checked by the
    project's one SSHSIG verifier against the allowed signers (ledger.gitops.signed), an
    OpenPGP one by git and gpg against GitHub's web-flow keys."""

    def verify(sha: str, allowed_signers: str) -> Signature:
        raw = repo.commit_object(sha)
        payload, armored = split_signed(raw)
        if armored is None:
            return Signature("none")
        if is_ssh(armored):
            return ssh_verdict(payload, armored, allowed_signers, committed_at(raw))
        keys = web_flow or _shipped_web_flow()
        _, said = repo.verify_openpgp(sha, keys.home())
        if "[GNUPG:]" not in said:  # neither SSH nor OpenPGP (an X.509 signature, say)
            return Signature("bad", detail=said.splitlines()[-1] if said else "a signature of an unknown kind")
        found = verdict(said, keys.trusted)
        return Signature(found.status, WEB_FLOW_PRINCIPAL if found.status == "good" else "", found.fingerprint,
                         found.detail, web_flow=found.status == "good", kind="openpgp")

    return verify


@functools.cache
def _shipped_web_flow() -> WebFlowKeys:
    return WebFlowKeys.configured()


def _needed_blobs(changes: Iterable[Change]) -> list[str]:
    wanted = []
    for ch in changes:
        if ch.new_blob != ZERO and (is_job_path(ch.path) or is_governed(ch.path)):
            wanted.append(ch.new_blob)
    return wanted


def _ingest_commits(
    repo: GitRepo, store: Store, branch: str, pos: Position, commits: list[Commit],
    validate: Validator, hash_spec: Callable[[Any], str], live: _Liveness, report: IngestReport,
    sources: Sources | None = None,
) -> None:
    bases: list[str | None] = []
    prev = pos.commit
    for c in commits:
        # Each step diffs against the tree ingested before it, so the ledger follows the
        # branch even when a first parent is not the previous position.
        bases.append(prev if prev is not None else None)
        prev = c.sha
    diffs = repo.diffs([(c.sha, b) for c, b in zip(commits, bases, strict=True)])
    blobs = repo.read_blobs(b for c in commits for b in _needed_blobs(diffs.get(c.sha, [])))
    state = _load_state(repo, pos.governing)
    steps = [
        StepInput(c, b, diffs.get(c.sha, []), blobs, _authors(repo, c, b), branch)
        for c, b in zip(commits, bases, strict=True)
    ]
    _append_steps(store, branch, pos, steps, state, validate, hash_spec, live, report,
                  sources or Sources(signature_verifier(repo)))


def _ingest_rewrite(
    repo: GitRepo, store: Store, branch: str, pos: Position,
    validate: Validator, hash_spec: Callable[[Any], str], live: _Liveness, report: IngestReport, sources: Sources,
) -> None:
    """An accepted rewrite: one step with the net change from the old head's tree to the new."""
    old, new = pos.accepted["old_head"], pos.accepted["new_head"]
    commit = repo.commit(new)
    if repo.exists(old):
        changes = repo.diffs([(new, old)]).get(new, [])
    else:
        # The old commits were garbage-collected: compare the new tree with what the ledger
        # says is live instead (a full scan, but only for this rare, operator-driven step).
        changes = _changes_from_ledger(repo, store, new, pos.governing)
    blobs = repo.read_blobs(_needed_blobs(changes))
    step = StepInput(commit, old, changes, blobs, _authors(repo, commit, None), branch)
    _append_steps(store, branch, pos, [step], _load_state(repo, pos.governing), validate, hash_spec, live, report,
                  sources)


def _changes_from_ledger(repo: GitRepo, store: Store, new: str, governing: dict[str, str]) -> list[Change]:
    """The job files as the ledger last saw them (path -> blob), diffed against `new`'s tree."""
    seen: dict[str, str] = {}
    for ev in store.read_all():
        path = ev.data.get("path") if not ev.stream.startswith("_") else None
        if not path or "blob" not in ev.data:
            continue
        if ev.type == "cancel_requested" or (ev.type == "rejected" and ev.data.get("removal")):
            if ev.type == "cancel_requested":
                seen.pop(path, None)
        elif ev.type in ("submitted", "spec_updated", "rejected"):
            seen[path] = ev.data["blob"]
    tree = {p: b for p, b in repo.tree_files(new, JOBS_DIR + "/").items() if is_job_path(p)}
    tree.update(repo.governed_files(new))
    before = {**seen, **governing}
    changes = [Change("D", p, None, b, ZERO) for p, b in sorted(before.items()) if p not in tree]
    for p, b in sorted(tree.items()):
        if p not in before:
            changes.append(Change("A", p, None, ZERO, b))
        elif before[p] != b:
            changes.append(Change("M", p, None, before[p], b))
    return changes


def _append_steps(
    store: Store, branch: str, pos: Position, steps: list[StepInput], state: RepoState,
    validate: Validator, hash_spec: Callable[[Any], str], live: _Liveness, report: IngestReport,
    sources: Sources,
) -> None:
    stream = stream_for(branch)
    git_version = pos.version
    batches: list[tuple[str, list[NewEvent], int | None]] = []
    markers: list[int] = []  # index in batches of each commit's marker
    pending_live: dict[str, bool] = {}
    counts: dict[str, int] = {}
    n_events = 0

    def is_live(jid: str) -> bool:
        return pending_live[jid] if jid in pending_live else live(jid)

    for step in steps:
        events, state, changed = decide(step, state, is_live, validate, hash_spec, sources.verify, sources.reviews)
        pending_live.update(changed)
        for s, ev in events:
            if s == stream:
                batches.append((s, [ev], git_version))
                git_version += 1
            elif batches and batches[-1][0] == s:
                batches[-1][1].append(ev)
            else:
                batches.append((s, [ev], None))
            counts[ev.type] = counts.get(ev.type, 0) + 1
            n_events += 1
        marker = NewEvent(
            "note",
            Note(kind="ingested", commit=step.commit.sha, base=step.base, governing=state.blobs(), events=len(events)),
            watcher_actor(branch), key=f"ingested:{step.base}:{step.commit.sha}", causation=f"git:{step.commit.sha}",
        )
        markers.append(len(batches))
        batches.append((stream, [marker], git_version))
        git_version += 1
    results = store.append_many(batches)
    done = sum(1 for i in markers if not results[i].duplicate)
    report.commits += done
    report.skipped += len(markers) - done
    if done:
        live.known.update(pending_live)
        report.events += n_events
        for k, v in counts.items():
            report.counts[k] = report.counts.get(k, 0) + v
    else:
        live.known.clear()
