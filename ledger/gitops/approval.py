"""Approval: does a commit carry the approval `.ledger/policy.yaml` asks for? Pure functions.

The rules are the policy's `approval` section (`ledger.spec.policy.ApprovalPolicy`) and its
`teams`. Two kinds of evidence, chosen by `approval.mode`:
- `merge-commit`: the host's branch protection is trusted; a merge commit (or a squash
  commit) whose message names a pull/merge request counts, and its number is recorded.
- `trailers`: `required` distinct `Approved-by:` / `Reviewed-by:` trailers (as git itself
  parses the commit's trailer block) from approvers: a list in the policy, or the CODEOWNERS
  owners of the path, a team meaning its members; an author of the change never counts.
- `either`: one or the other.
With `approval.signatures: required`, neither counts unless the commit carries a good
signature by a key of the allowed-signers file, from someone who is not an author of the
change: a message anyone can type ("Merge pull request #1") proves nothing by itself.

Who is who: `Evidence.authors` are the people who wrote the change of the path (for a merge:
the authors of the merged commits that touched it), `merger` is who landed it on the branch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ledger.spec.codeowners import CodeOwnersFile
from ledger.spec.layout import ALLOWED_SIGNERS_PATH, CODEOWNERS_PATHS, POLICY_PATH
from ledger.spec.policy import Policy

APPROVAL_TRAILERS = ("approved-by", "reviewed-by")
# Files that decide who may approve: a change to them must itself be approved.
GOVERNING_PATHS = (POLICY_PATH, ALLOWED_SIGNERS_PATH, *CODEOWNERS_PATHS)

_IDENT = re.compile(r"^(.*?)\s*<([^>]*)>\s*$")
_GITHUB_MERGE = re.compile(r"^Merge pull request #(\d+)\b", re.MULTILINE)
_GITLAB_MERGE = re.compile(r"See merge request \S*!(\d+)")
_SQUASH = re.compile(r"\(#(\d+)\)\s*$")


@dataclass(frozen=True, slots=True)
class Identity:
    name: str
    email: str

    def tokens(self) -> set[str]:
        """Every spelling an owner entry may use for this person."""
        out = {t.lower() for t in (self.name, self.email) if t}
        if self.name:
            out.add("@" + self.name.lower())
        if "@" in self.email:
            out.add("@" + self.email.split("@", 1)[0].lower())
        return out

    def display(self) -> str:
        return f"{self.name} <{self.email}>" if self.email else self.name

    def key(self) -> str:
        """One person, one approval: by e-mail when there is one, else by name."""
        return (self.email or self.name).lower()


@dataclass(frozen=True, slots=True)
class Signature:
    """What `git verify-commit` said about a commit, against the allowed-signers file.

    good: verified and the key is listed (`principal` is its principal); none: unsigned;
    untrusted: a valid signature by a key the file does not list (or no file); bad: it does
    not verify. `key` is the key's fingerprint, `detail` git's own words.
    """

    status: Literal["good", "none", "untrusted", "bad"]
    principal: str = ""
    key: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Evidence:
    """What one commit says about the change of one path, as git parsed it."""

    message: str
    parents: int
    trailers: tuple[tuple[str, str], ...]  # (key lowercased, value), git's unfolded parse
    authors: tuple[Identity, ...]  # who wrote the change of this path (never approve it)
    merger: Identity | None = None  # who landed it: a merge's author, else a differing committer
    signature: Signature | None = None  # None: not checked (the policy does not ask)


@dataclass(frozen=True, slots=True)
class Approval:
    ok: bool
    approvers: tuple[str, ...] = ()  # who approved (display form)
    pr: int | None = None
    reason: str = ""
    would_approve: tuple[str, ...] = ()  # who may (still) approve
    via: str = ""  # "trailers" | "merge-commit"
    signer: str = ""  # the allowed signer's principal, when signatures are required


def parse_identity(text: str) -> Identity:
    m = _IDENT.match(text.strip())
    if m:
        return Identity(m.group(1).strip(), m.group(2).strip())
    text = text.strip()
    return Identity("", text) if "@" in text and " " not in text else Identity(text, "")


def pull_request_number(message: str, parents: int) -> int | None:
    """The PR/MR number a host writes into a merge (or squash) commit's message."""
    for pattern in (_GITHUB_MERGE, _GITLAB_MERGE):
        m = pattern.search(message)
        if m and parents >= 2:
            return int(m.group(1))
    subject = message.strip().splitlines()[0] if message.strip() else ""
    m = _SQUASH.search(subject)
    return int(m.group(1)) if m else None


# -- who may approve ---------------------------------------------------------------------
def eligible(policy: Policy, codeowners: CodeOwnersFile | None, path: str) -> tuple[str, ...]:
    """The owners who may approve `path`, as written (handles, team handles, e-mails)."""
    listed = policy.approval.approvers
    if listed is not None:
        return listed
    return codeowners.owners(path) if codeowners is not None else ()


def people(policy: Policy, owners: tuple[str, ...]) -> tuple[str, ...]:
    """The owners with each team replaced by its members (an unknown team has none)."""
    out: list[str] = []
    for owner in owners:
        members = policy.teams.of(owner)
        if members is not None:
            out.extend(members)
        elif not policy.teams.unknown(owner):
            out.append(owner)
    return tuple(dict.fromkeys(out))


def _is(entry: str, who: Identity) -> bool:
    return entry.strip().lower() in who.tokens()


def _authored_by(who: Identity, authors: tuple[Identity, ...]) -> bool:
    tokens = who.tokens()
    return any(tokens & {t for t in (a.name.lower(), a.email.lower()) if t} for a in authors)


def may_still_approve(policy: Policy, owners: tuple[str, ...], authors: tuple[Identity, ...]) -> tuple[str, ...]:
    """The people among `owners` (teams expanded) who are not authors of the change."""
    return tuple(p for p in people(policy, owners) if not any(_is(p, a) for a in authors))


def _signature_problem(sig: Signature | None, authors: tuple[Identity, ...]) -> str | None:
    if sig is None or sig.status == "none":
        return "the commit is not signed, and approval.signatures is required"
    if sig.status == "untrusted":
        return f"the commit is signed by key {sig.key or '?'}, which {ALLOWED_SIGNERS_PATH} does not list" + (
            f" ({sig.detail})" if sig.detail else "")
    if sig.status == "bad":
        return f"the commit's signature does not verify ({sig.detail or 'git verify-commit failed'})"
    if _authored_by(parse_identity(sig.principal), authors):
        return f"the commit is signed by {sig.principal}, an author of the change: an author cannot approve it"
    return None


# -- the decision -----------------------------------------------------------------------
def evaluate(policy: Policy, evidence: Evidence, path: str, codeowners: CodeOwnersFile | None) -> Approval:
    """Is the change of `path` in a commit with this evidence approved?"""
    rules = policy.approval
    owners = eligible(policy, codeowners, path)
    would = may_still_approve(policy, owners, evidence.authors)
    pr = pull_request_number(evidence.message, evidence.parents)
    if rules.signatures:
        problem = _signature_problem(evidence.signature, evidence.authors)
        if problem is not None:
            return Approval(False, (), pr, f"not approved: {problem}", would)
    signer = evidence.signature.principal if rules.signatures and evidence.signature else ""

    entitled = people(policy, owners)
    approved: dict[str, str] = {}  # person -> display, in trailer order
    for key, value in evidence.trailers:
        if key not in APPROVAL_TRAILERS:
            continue
        who = parse_identity(value)
        if _authored_by(who, evidence.authors) or not any(_is(p, who) for p in entitled):
            continue
        approved.setdefault(who.key(), who.display())
    names = tuple(approved.values())
    if rules.mode in ("trailers", "either") and names and len(names) >= rules.required:
        return Approval(True, names, pr, via="trailers", signer=signer)
    if rules.mode in ("merge-commit", "either") and pr is not None:
        # The host's merge is the approval; whoever merged approved it, unless trailers say who.
        merger = (evidence.merger.display(),) if evidence.merger else ()
        return Approval(True, names or merger, pr, via="merge-commit", signer=signer)

    if rules.mode == "merge-commit":
        reason = "not approved: no merged pull request recorded in the merge commit"
    elif not owners:
        reason = f"not approved: nobody may approve {path} (no CODEOWNERS entry and no approvers in policy)"
    else:
        need = rules.required - len(names)
        unknown = [o for o in owners if policy.teams.unknown(o)]
        reason = f"not approved: needs {need} more approval(s) from {', '.join(would) or 'an approver other than the author'}"
        if unknown:
            reason += f" ({', '.join(unknown)}: not a team of the policy)"
        if rules.mode == "either":
            reason += " or a merged pull request"
    return Approval(False, names, pr, reason, would)
