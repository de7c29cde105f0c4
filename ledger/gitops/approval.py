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

A forge adds two kinds of evidence (`ledger.forge`): GitHub's web-flow OpenPGP signature on
a merge GitHub made (counts as signed merge-commit evidence with `approval.web_flow:
accepted`, never for trailers: GitHub also signs what is typed in its web editor), and the
pull request's reviews (`Evidence.reviews`): each reviewer's latest verdict on the merged
head commit; APPROVED ones by people who did not write the change are the approvers, each
with their CODEOWNERS standing, and `approval.reviews: required` makes `required` of them
from approvers of the path a condition of a merged pull request.

Tenancy (`tenancy_problem`): a job under jobs/<owner>/ runs with <owner>'s secrets and quota,
so <owner> must have written or approved the change, or be represented by a delegate the
policy names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ledger.forge.reviews import PullReviews, Review
from ledger.spec.codeowners import CodeOwnersFile
from ledger.spec.layout import ALLOWED_SIGNERS_PATH, CODEOWNERS_PATHS, POLICY_PATH
from ledger.spec.policy import Policy

APPROVAL_TRAILERS = ("approved-by", "reviewed-by")
# Files that decide who may approve: a change to them must itself be approved.
GOVERNING_PATHS = (POLICY_PATH, ALLOWED_SIGNERS_PATH, *CODEOWNERS_PATHS)

NOREPLY_DOMAIN = "users.noreply.github.com"
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
            local, _, domain = self.email.lower().partition("@")
            out.add("@" + local)
            if domain == NOREPLY_DOMAIN:  # GitHub's `<id>+<login>@users.noreply.github.com`
                out.add("@" + local.rpartition("+")[2])
        return out

    def display(self) -> str:
        return f"{self.name} <{self.email}>" if self.email else self.name

    def key(self) -> str:
        """One person, one approval: by e-mail when there is one, else by name."""
        return (self.email or self.name).lower()


@dataclass(frozen=True, slots=True)
class Signature:
    """What a commit's signature says, against the allowed-signers file (an SSH signature:
    ledger.gitops.signed's check, the project's one SSHSIG verifier; an OpenPGP one: gpg's).

    good: verified and the key is listed (`principal` is its principal); none: unsigned;
    untrusted: a valid signature by a key the file does not list (or no file); bad: it does
    not verify. `key` is the key's fingerprint, `detail` the verifier's own words.
    """

    status: Literal["good", "none", "untrusted", "bad"]
    principal: str = ""
    key: str = ""
    detail: str = ""
    web_flow: bool = False  # made by GitHub with its web-flow OpenPGP key (ledger.forge.webflow)
    kind: Literal["ssh", "openpgp"] = "ssh"


@dataclass(frozen=True, slots=True)
class Evidence:
    """What one commit says about the change of one path, as git parsed it."""

    message: str
    parents: int
    trailers: tuple[tuple[str, str], ...]  # (key lowercased, value), git's unfolded parse
    authors: tuple[Identity, ...]  # who wrote the change of this path (never approve it)
    merger: Identity | None = None  # who landed it: a merge's author, else a differing committer
    signature: Signature | None = None  # None: not checked (the policy does not ask)
    reviews: PullReviews | None = None  # the forge's reviews of the merged pull request; None: no forge


@dataclass(frozen=True, slots=True)
class Approval:
    ok: bool
    approvers: tuple[str, ...] = ()  # who approved (display form)
    pr: int | None = None
    reason: str = ""
    would_approve: tuple[str, ...] = ()  # who may (still) approve
    via: str = ""  # "trailers" | "merge-commit"
    signer: str = ""  # the allowed signer's principal, when signatures are required
    reviews: tuple[Review, ...] = ()  # the approving reviews on the merged head, standing set
    # everyone who said yes in the evidence that counted, eligible or not (trailers, reviews):
    # consent for tenancy, which asks whether the job's owner agreed, not whether they may approve
    endorsers: tuple[str, ...] = ()


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


def _signature_problem(sig: Signature | None, authors: tuple[Identity, ...], web_flow: bool) -> str | None:
    if sig is not None and sig.status == "good" and sig.web_flow and not web_flow:
        return "the commit is signed by GitHub's web-flow key, and approval.web_flow is not `accepted`"
    if sig is None or sig.status == "none":
        return "the commit is not signed, and approval.signatures is required"
    if sig.status == "untrusted" and sig.kind == "openpgp":
        return f"the commit is {sig.detail}"
    if sig.status == "untrusted":
        return f"the commit is signed by key {sig.key or '?'}, which {ALLOWED_SIGNERS_PATH} does not list" + (
            f" ({sig.detail})" if sig.detail else "")
    if sig.status == "bad":
        return f"the commit's signature does not verify ({sig.detail or 'the signature check failed'})"
    if _authored_by(parse_identity(sig.principal), authors):
        return f"the commit is signed by {sig.principal}, an author of the change: an author cannot approve it"
    return None


# -- the decision -----------------------------------------------------------------------
def _reviewer(review: Review) -> Identity:
    return Identity(review.login, "")


def reviewed(reviews: PullReviews, authors: tuple[Identity, ...]) -> tuple[Review, ...]:
    """The approving reviews that count: each reviewer's latest verdict (a later change
    request or dismissal cancels an approval, as on GitHub), APPROVED, on the merged head
    commit, by someone who did not write the change."""
    latest: dict[str, Review] = {}
    for r in sorted(reviews.reviews, key=lambda r: r.submitted_at):
        if r.state in ("APPROVED", "CHANGES_REQUESTED", "DISMISSED"):
            latest[r.login.lower()] = r
    return tuple(r for r in latest.values() if r.state == "APPROVED" and (not reviews.approvals_by_commit or (reviews.head is not None and r.commit == reviews.head))
                 and not _authored_by(_reviewer(r), authors))


def evaluate(policy: Policy, evidence: Evidence, path: str, codeowners: CodeOwnersFile | None) -> Approval:
    """Is the change of `path` in a commit with this evidence approved?"""
    rules = policy.approval
    owners = eligible(policy, codeowners, path)
    would = may_still_approve(policy, owners, evidence.authors)
    pr = pull_request_number(evidence.message, evidence.parents)
    sig = evidence.signature
    if rules.signatures:
        problem = _signature_problem(sig, evidence.authors, rules.web_flow)
        if problem is not None:
            return Approval(False, (), pr, f"not approved: {problem}", would)
    signer = sig.principal if rules.signatures and sig else ""
    # GitHub's signature vouches for GitHub's merge, never for a trailer someone typed
    trailers_count = not (rules.signatures and sig is not None and sig.web_flow)

    entitled = people(policy, owners)
    approved: dict[str, str] = {}  # person -> display, in trailer order
    endorsed: dict[str, str] = {}
    for key, value in evidence.trailers if trailers_count else ():
        if key not in APPROVAL_TRAILERS:
            continue
        who = parse_identity(value)
        if _authored_by(who, evidence.authors):
            continue
        endorsed.setdefault(who.key(), who.display())
        if any(_is(p, who) for p in entitled):
            approved.setdefault(who.key(), who.display())
    names = tuple(approved.values())
    if rules.mode in ("trailers", "either") and names and len(names) >= rules.required:
        return Approval(True, names, pr, via="trailers", signer=signer, endorsers=tuple(endorsed.values()))
    if rules.mode in ("merge-commit", "either") and pr is not None:
        reviews: tuple[Review, ...] = ()
        if evidence.reviews is not None:
            reviews = tuple(r.standing(any(_is(p, _reviewer(r)) for p in entitled))
                            for r in reviewed(evidence.reviews, evidence.authors))
        if rules.reviews_required:
            problem = _review_problem(evidence.reviews, reviews, rules.required, would)
            if problem is not None:
                return Approval(False, names, pr, f"not approved: {problem}", would)
        # The host's merge is the approval; whoever merged approved it, unless trailers or
        # reviews say who.
        merger = (evidence.merger.display(),) if evidence.merger else ()
        by_review = tuple(r.display() for r in reviews)
        return Approval(True, names or by_review or merger, pr, via="merge-commit", signer=signer, reviews=reviews,
                        endorsers=(*endorsed.values(), *by_review))

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


def _review_problem(found: PullReviews | None, reviews: tuple[Review, ...], required: int,
                    would: tuple[str, ...]) -> str | None:
    if found is None:
        return ("approval.reviews is required, and the watcher has no forge to ask for the pull request's reviews "
                "(set LEDGER_FORGE and its token)")
    owners = [r for r in reviews if r.codeowner]
    if len(owners) >= required:
        return None
    head = (found.head or "?")[:12]
    return (f"the pull request has {len(owners)} approving review(s) on its merged head {head} from approvers of "
            f"the path, and approval.required is {required} (who may approve: {', '.join(would) or 'nobody'})")


# -- tenancy ------------------------------------------------------------------------------
def is_person(owner: str, who: Identity) -> bool:
    """Is `who` the owner named by a jobs/<owner>/ folder? By any spelling CODEOWNERS and
    trailers use: the name, the @handle, the e-mail's local part (GitHub's noreply address
    `123+owner@users.noreply.github.com` included)."""
    tokens = who.tokens()
    return owner.lower() in tokens or "@" + owner.lower() in tokens


def tenancy_problem(policy: Policy, owner: str, authors: tuple[Identity, ...], approval: Approval) -> str | None:
    """Why a change under jobs/<owner>/ may not act as <owner> (None: it may): <owner> wrote
    or approved it, or one who did is a delegate of <owner> in the policy."""
    acting = (*authors, *(parse_identity(a) for a in (*approval.approvers, *approval.endorsers)))
    if any(is_person(owner, who) for who in acting):
        return None
    delegates = people(policy, policy.delegates.of(owner))
    if any(_is(d, who) for d in delegates for who in acting):
        return None
    wrote = ", ".join(a.display() for a in authors) or "nobody"
    approved = ", ".join(approval.approvers) or "nobody"
    return (f"a job under jobs/{owner}/ runs with {owner}'s secrets and quota, and {owner} neither wrote nor "
            f"approved this change (written by {wrote}; approved by {approved}); ask {owner} to approve it, or an "
            f"admin to name a delegate of {owner} under `delegates:` in the policy")
