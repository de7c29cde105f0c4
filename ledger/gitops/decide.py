"""One commit's diff -> the events it means. Pure: no git, no store.

A job spec added or changed -> `submitted` (job absent or finished) or `spec_updated`
(job live); deleted -> `cancel_requested`; renamed -> cancel of the old id and submit of
the new one; invalid or unapproved -> `rejected` with the reason.

Every governed file (`ledger.spec.layout.is_governed`: anything under .ledger/, CODEOWNERS)
changes only with the approval the policy in force *before* the commit asks for; an
unapproved change is `rejected` on the branch's stream and the old file stays in force.
The files that decide approval (policy, allowed signers, CODEOWNERS) take effect after the
commit, so a commit can never approve itself; the others (aliases, ...) before its jobs, so
a job may use an alias its own approved commit adds.

A job under jobs/<owner>/ runs with <owner>'s secrets and quota: it is `rejected` unless
<owner> wrote or approved the change, or a delegate the policy names did.

A commit that changes the policy in force also means a `policy_changed` fact on the
`_policy` stream (its price table and sharing rules, as they stand after the commit).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from ledger.events import NewEvent, actor
from ledger.events import data as ev
from ledger.forge.reviews import PullReviews, ReviewLookup
from ledger.gitops.approval import (
    GOVERNING_PATHS,
    Approval,
    Evidence,
    Identity,
    Signature,
    evaluate,
    pull_request_number,
    tenancy_problem,
)
from ledger.gitops.position import stream_for
from ledger.gitops.repo import Change, Commit
from ledger.spec.codeowners import CodeOwnersFile, parse_codeowners
from ledger.spec.layout import (
    ALLOWED_SIGNERS_PATH,
    CODEOWNERS_PATHS,
    POLICY_PATH,
    is_governed,
    is_job_path,
)
from ledger.spec.names import job_id_for, safe_stream, shown
from ledger.spec.policy import Policy, parse_policy, sharing_blocks
from ledger.usage.prices import POLICY_STREAM


@dataclass(slots=True)
class RepoState:
    """What the branch's approved configuration is: path -> (blob, text)."""

    files: dict[str, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, files: Mapping[str, str], blobs: Mapping[str, bytes]) -> RepoState:
        """The configuration `path -> blob id`, each text read from `blobs`."""
        return cls({p: (b, blob_text(blobs, b)) for p, b in files.items()})

    def text(self, path: str) -> str | None:
        entry = self.files.get(path)
        return entry[1] if entry else None

    def blobs(self) -> dict[str, str]:
        return {p: b for p, (b, _) in sorted(self.files.items())}

    def codeowners(self) -> CodeOwnersFile | None:
        for path in CODEOWNERS_PATHS:  # first found wins, as on GitHub
            text = self.text(path)
            if text is not None:
                return parse_codeowners(text, path)
        return None

    def policy(self) -> Policy:
        """The policy as `ledger validate` reads it (a broken block = its section's fallback)."""
        return parse_policy(self.text(POLICY_PATH)).policy


def blob_text(blobs: Mapping[str, bytes], blob: str) -> str:
    return blobs.get(blob, b"").decode("utf-8", "replace")


def _email_or_name(who: Identity) -> str:
    return who.email or who.name


def _signature(sha: str, state: RepoState, verify: Verifier | None) -> Signature:
    """The commit's signature against the approved allowed-signers file (never one the
    commit brings: a commit cannot vouch for itself), or GitHub's web-flow keys."""
    if verify is None:
        return Signature("bad", detail="no signature verifier was given")
    signers = state.text(ALLOWED_SIGNERS_PATH) or ""
    found = verify(sha, signers)
    if found.kind == "ssh" and found.status != "none" and not signers.strip():
        return Signature("untrusted", key=found.key, detail=f"the branch has no {ALLOWED_SIGNERS_PATH}")
    return found


@dataclass(frozen=True, slots=True)
class Ignored:
    """A validator's answer for a file the policy's `ignore` globs exclude: never runs."""

    path: str
    ok: bool = True
    job_id: None = None
    spec: None = None
    errors: tuple = ()
    warnings: tuple = ()


@dataclass(frozen=True, slots=True)
class StepInput:
    commit: Commit
    base: str | None  # the commit diffed against (first parent, or the old head on a rewrite)
    changes: list[Change]
    blobs: Mapping[str, bytes]
    # path -> who wrote its change: for a merge, the authors of the merged commits that
    # touched it; a path not listed was written by the commit's author.
    authors: Mapping[str, tuple[Identity, ...]]
    branch: str

    def authors_of(self, path: str) -> tuple[Identity, ...]:
        return self.authors.get(path) or (Identity(self.commit.author_name, self.commit.author_email),)

    def merger(self) -> Identity | None:
        """Who landed the commit: a merge's author, or a committer other than the author
        (a squash or rebase by the host or a maintainer); None for a plain push."""
        c = self.commit
        if len(c.parents) > 1:
            return Identity(c.author_name, c.author_email)
        if c.committer_email.lower() != c.author_email.lower():
            return Identity(c.committer_name, c.committer_email)
        return None


# `verify(commit sha, allowed-signers text) -> Signature`: git's verdict (the adapter's).
Verifier = Callable[[str, str], Signature]


def _message_dict(m: Any) -> dict[str, Any]:
    if is_dataclass(m):
        return asdict(m)
    if isinstance(m, Mapping):
        return dict(m)
    return {"message": str(m)}


def _printable(value: Any) -> Any:
    # A git path may hold bytes that are not UTF-8 (decoded as surrogate escapes): JSON
    # cannot carry them, so they are recorded as \xNN, as `ledger validate` shows them.
    return shown(value) if isinstance(value, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in value) else value


def _findings(messages: Any) -> list[ev.Finding]:
    """Spec messages (ledger.spec.Message, or mappings, or text) as recorded findings."""
    found = [{k: _printable(v) for k, v in _message_dict(m).items()} for m in messages]
    return ev.check(found, list[ev.Finding], "spec findings")


def decide(
    step: StepInput,
    state: RepoState,
    is_live: Callable[[str], bool],
    validate: Callable[[bytes, str, RepoState], Any],
    spec_hash: Callable[[Any], str],
    verify: Verifier | None = None,
    reviews: ReviewLookup | None = None,
) -> tuple[list[tuple[str, NewEvent]], RepoState, dict[str, bool]]:
    """Events (stream, NewEvent) for one step, the configuration after it, liveness updates.

    `validate(text, path, state)` returns a SpecResult; `is_live(job_id)` says whether the
    job currently runs (decides submitted vs spec_updated for a changed file); `verify` is
    asked for the commit's signature when the policy requires signatures; `reviews` (a
    forge) for a merged pull request's reviews, once per commit that needs them.
    """
    c = step.commit
    policy_before = state.files.get(POLICY_PATH)
    policy = state.policy()
    owners = state.codeowners()
    out: list[tuple[str, NewEvent]] = []
    live: dict[str, bool] = {}
    git_stream = stream_for(step.branch)
    merger = step.merger()

    @functools.cache
    def signature() -> Signature | None:
        # asked once, and only for a commit that changes something approval guards
        return _signature(c.sha, state, verify) if policy.approval.signatures else None

    @functools.cache
    def pull_reviews() -> PullReviews | None:
        # asked once, only for a merged pull request under rules that let one count
        pr = pull_request_number(c.message, len(c.parents))
        if reviews is None or pr is None or policy.approval.mode == "trailers":
            return None
        return reviews(pr, c.parents[1] if len(c.parents) > 1 else None)

    def approval(path: str) -> Approval:
        evidence = Evidence(c.message, len(c.parents), c.trailers, step.authors_of(path), merger, signature(),
                            pull_reviews())
        return evaluate(policy, evidence, path, owners)

    def who(path: str, appr: Approval) -> dict[str, Any]:
        """The actor: whoever asked for the change (its first author), with who approved
        and who merged it."""
        first = step.authors_of(path)[0]
        extra: dict[str, Any] = {"email": first.email, "approvers": list(appr.approvers), "commit": c.sha}
        if merger is not None:
            extra["merger"] = merger.display()
        if appr.pr is not None:
            extra["pr"] = appr.pr
        return actor("git", first.name or first.email, **extra)

    def at(path: str, blob: str) -> dict[str, str]:
        """Where a change comes from: every event of a file's change records it."""
        return {"commit": c.sha, "path": _printable(path), "blob": blob}

    def emit(stream: str, path: str, blob: str, data: ev.EventData, appr: Approval) -> None:
        # The id depends on git alone (commit, path, blob, and whether the file came or
        # went), never on what the ledger held when deciding: two watchers that read the
        # ledger at different moments still produce the same id, and one of them is a no-op.
        removal = isinstance(data, ev.CancelRequested) or isinstance(data, ev.Rejected) and data.removal is True
        role = "remove" if removal else "add"
        out.append((stream, NewEvent(
            type=data.event_type, data=data, actor=who(path, appr), key=f"{c.sha}:{_printable(path)}:{blob}:{role}",
            causation=f"git:{c.sha}",
        )))

    def current(jid: str) -> bool:
        return live[jid] if jid in live else is_live(jid)

    def reject(stream: str, path: str, blob: str, reason: str, appr: Approval, errors: list[Any] = (),
               removal: bool = False) -> None:
        emit(stream, path, blob, ev.Rejected(
            **at(path, blob), removal=True if removal else ev.UNSET, reason=reason, errors=_findings(errors),
            would_approve=list(appr.would_approve), author=_email_or_name(step.authors_of(path)[0]),
        ), appr)

    def removed(path: str, blob: str) -> None:
        jid = job_id_for(path)
        ignored = getattr(validate, "ignored", None)
        # a path that cannot name a stream never became a job: its deletion stops nothing
        if jid is None or not safe_stream(jid) or (ignored is not None and ignored(path, state)):
            return
        appr = approval(path)
        if not appr.ok:
            reject(jid, path, blob, f"deletion {appr.reason}", appr, removal=True)
            return
        emit(jid, path, blob, ev.CancelRequested(**at(path, blob), reason="spec deleted"), appr)
        live[jid] = False

    def added(path: str, blob: str) -> None:
        text = step.blobs.get(blob, b"")
        result = validate(text, path, state)
        if isinstance(result, Ignored):
            return
        jid = getattr(result, "job_id", None) or job_id_for(path)
        # A rejection is filed under the job id the path names, even an invalid one, so its
        # author finds it; a name that cannot be a stream (control characters, bytes that are
        # not UTF-8) is filed on the branch's stream instead.
        stream = jid if safe_stream(jid) else git_stream
        appr = approval(path)
        if not result.ok:
            reject(stream, path, blob, "invalid spec", appr, list(result.errors))
            return
        if not appr.ok:
            reject(stream, path, blob, appr.reason, appr)
            return
        owner, _, name = (jid or "/").partition("/")
        problem = tenancy_problem(policy, owner, step.authors_of(path), appr)
        if problem is not None:
            reject(stream, path, blob, f"not allowed: {problem}", appr)
            return
        warnings = list(getattr(result, "warnings", []) or [])
        arrived = ev.SpecUpdated if current(stream) else ev.Submitted
        authors = step.authors_of(path)
        emit(stream, path, blob, arrived(
            **at(path, blob), spec=result.spec, spec_hash=spec_hash(result.spec),
            author=_email_or_name(authors[0]), author_name=authors[0].name,
            authors=[a.display() for a in authors] if len(authors) > 1 else ev.UNSET,
            merger=merger.display() if merger is not None else ev.UNSET,
            approvers=list(appr.approvers), owner=owner, name=name, committed_at=c.time,
            pr=ev.UNSET if appr.pr is None else appr.pr, warnings=_findings(warnings) if warnings else ev.UNSET,
            signed_by=appr.signer or ev.UNSET,
            reviews=[ev.ReviewRecord(login=r.login, commit=r.commit or ev.UNSET, codeowner=r.codeowner)
                     for r in appr.reviews] or ev.UNSET,
        ), appr)
        live[stream] = True

    governed = [ch for ch in step.changes if is_governed(ch.path) or is_governed(ch.old_path)]
    # Trust on first use: until the branch has a policy or CODEOWNERS, nobody could approve
    # the first one, so the first governed files are taken as they come, and govern the
    # commit that brings them (its `ignore:` globs, its approvers), like a repo's first push.
    bootstrap = not any(p in state.files for p in GOVERNING_PATHS)
    accepted: list[Change] = []
    for ch in governed:
        if not bootstrap:
            touched = [p for p in dict.fromkeys((ch.old_path, ch.path)) if is_governed(p)]
            refused = next((a for a in map(approval, touched) if not a.ok), None)
            if refused is not None:
                reject(git_stream, ch.path, ch.new_blob,
                       f"change to {_printable(ch.path)} {refused.reason}; the old file stays in force", refused)
                continue
        accepted.append(ch)
    # The files that decide approval take effect after this commit's jobs (a commit never
    # approves itself); the others, such as aliases, before them. On bootstrap, all before.
    early = [ch for ch in accepted if bootstrap or not _decides_approval(ch)]
    state = _applied(state, early, step.blobs)
    for ch in step.changes:  # the job side of each change (a governed file is no job path)
        if ch.status == "R" or ch.status == "C":
            if ch.status == "R" and ch.old_path and is_job_path(ch.old_path):
                removed(ch.old_path, ch.old_blob)
            if is_job_path(ch.path):
                added(ch.path, ch.new_blob)
        elif ch.status == "D":
            if is_job_path(ch.path):
                removed(ch.path, ch.old_blob)
        elif is_job_path(ch.path):
            added(ch.path, ch.new_blob)

    new_state = _applied(state, [ch for ch in accepted if ch not in early], step.blobs)
    if new_state.files.get(POLICY_PATH) != policy_before:
        out.append(policy_changed(step, new_state))
    return out, new_state, live


def watcher_actor(branch: str, **extra: Any) -> dict[str, Any]:
    return actor("watcher", "ledger watch", branch=branch, **extra)


def policy_changed(step: StepInput, state: RepoState) -> tuple[str, NewEvent]:
    """The policy in force changed with this commit: its price table becomes a fact of the
    ledger, so usage reports price each interval as it was priced then, forever."""
    entry = state.files.get(POLICY_PATH)
    parsed = parse_policy(entry[1] if entry else None)
    broken = any(m.pointer.startswith("/prices") or not m.pointer for m in parsed.errors)
    prices = [ev.Price(family=f, pricing=p, usd_per_chip_hour=usd) for (f, p), usd in parsed.policy.prices.usd.items()]
    data = ev.PolicyChanged(commit=step.commit.sha, prices=prices, blob=entry[0] if entry else ev.UNSET,
                            branch=step.branch, broken=True if broken else ev.UNSET, sharing=sharing_blocks(parsed.policy))
    return POLICY_STREAM, NewEvent("policy_changed", data, watcher_actor(step.branch),
                                   key=f"policy:{step.commit.sha}:{entry[0] if entry else 'deleted'}",
                                   causation=f"git:{step.commit.sha}")


def _decides_approval(ch: Change) -> bool:
    return ch.path in GOVERNING_PATHS or (ch.old_path or "") in GOVERNING_PATHS


def _applied(state: RepoState, changes: list[Change], blobs: Mapping[str, bytes]) -> RepoState:
    """`state` with the accepted changes of governed files made (a new RepoState)."""
    if not changes:
        return state
    files = dict(state.files)
    for ch in changes:
        if ch.status == "R" and ch.old_path:
            files.pop(ch.old_path, None)
        if ch.status == "D":
            files.pop(ch.path, None)
        elif is_governed(ch.path):
            files[ch.path] = (ch.new_blob, blob_text(blobs, ch.new_blob))
    return RepoState(files)
