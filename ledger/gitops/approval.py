"""Approval: does a commit carry the approval `.ledger/policy.yaml` asks for? Pure functions.

The rules are the policy's `approval` section (`ledger.spec.policy.ApprovalPolicy`).
Two kinds of evidence, chosen by `approval.mode`:
- `merge-commit`: the host's branch protection is trusted; a merge commit (or a squash
  commit) whose message names a pull/merge request counts, and its number is recorded.
- `trailers`: `required` distinct `Approved-by:` / `Reviewed-by:` trailers from approvers
  (a list in the policy, or the CODEOWNERS owners of the path); the commit's authors
  (for a merge: everyone whose commits it brings in) never count.
- `either`: one or the other.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ledger.spec.layout import CODEOWNERS_PATHS, POLICY_PATH
from ledger.spec.policy import ApprovalPolicy

APPROVAL_TRAILERS = ("approved-by", "reviewed-by")
# Files that decide who may approve: a change to them must itself be approved.
GOVERNING_PATHS = (POLICY_PATH, *CODEOWNERS_PATHS)

_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*)\s*:\s*(.+?)\s*$")
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


@dataclass(frozen=True, slots=True)
class Approval:
    ok: bool
    approvers: tuple[str, ...] = ()  # who approved (display form)
    pr: int | None = None
    reason: str = ""
    would_approve: tuple[str, ...] = ()  # who could approve, when not approved
    via: str = ""  # "trailers" | "merge-commit"


def parse_trailers(message: str) -> list[tuple[str, str]]:
    """(key lowercased, value) of the trailer block: the last paragraph, all `Key: value`."""
    paragraphs = [p for p in re.split(r"\n\s*\n", message.strip()) if p.strip()]
    if len(paragraphs) < 2:
        return []
    found = []
    for line in paragraphs[-1].splitlines():
        m = _TRAILER.match(line.strip())
        if m is None:
            return []  # not a trailer block (git's rule: every line must be a trailer)
        found.append((m.group(1).lower(), m.group(2)))
    return found


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


# -- CODEOWNERS -------------------------------------------------------------------------
def parse_codeowners(text: str) -> list[tuple[str, tuple[str, ...]]]:
    rules = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip() if not line.lstrip().startswith("\\#") else line.strip()
        if not line:
            continue
        pattern, *owners = line.split()
        rules.append((pattern, tuple(owners)))
    return rules


def _pattern_matches(pattern: str, path: str) -> bool:
    anchored = pattern.startswith("/")
    pat = pattern.lstrip("/")
    if pat.endswith("/"):
        pat += "**"
    if pat.endswith("/**") and (path + "/").startswith(pat[:-2]) and anchored:
        return True
    candidates = [path] if anchored or "/" in pat.rstrip("*") else [path, *_suffixes(path)]
    for cand in candidates:
        if fnmatch.fnmatchcase(cand, pat) or fnmatch.fnmatchcase(cand, pat.replace("**/", "")):
            return True
        if pat.endswith("/**") and cand.startswith(pat[:-2]):
            return True
        # a directory pattern without a slash covers everything below it
        if "/" not in pat and any(fnmatch.fnmatchcase(part, pat) for part in cand.split("/")[:-1]):
            return True
    return False


def _suffixes(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[i:]) for i in range(1, len(parts))]


def owners_for(rules: list[tuple[str, tuple[str, ...]]], path: str) -> tuple[str, ...]:
    """The owners of `path`: the last matching rule wins, as on GitHub and GitLab."""
    owners: tuple[str, ...] = ()
    for pattern, names in rules:
        if _pattern_matches(pattern, path):
            owners = names
    return owners


# -- the decision -----------------------------------------------------------------------
def _matches(owner: str, identity: Identity) -> bool:
    return owner.strip().lower() in identity.tokens()


def evaluate(
    policy: ApprovalPolicy,
    *,
    message: str,
    parents: int,
    authors: Iterable[str],
    path: str,
    codeowners: list[tuple[str, tuple[str, ...]]],
) -> Approval:
    """Is the change of `path` in a commit with this message approved?

    `authors`: lowercased names/emails of whoever wrote the change; they never approve it.
    """
    authors = {a.lower() for a in authors}
    pr = pull_request_number(message, parents)
    if policy.mode in ("merge-commit", "either") and pr is not None:
        return Approval(True, (), pr, via="merge-commit")

    eligible = policy.approvers if policy.approvers is not None else owners_for(codeowners, path)
    approved: list[str] = []
    seen: set[str] = set()
    if policy.mode in ("trailers", "either"):
        for key, value in parse_trailers(message):
            if key not in APPROVAL_TRAILERS:
                continue
            who = parse_identity(value)
            tokens = who.tokens()
            if tokens & authors or not any(_matches(o, who) for o in eligible):
                continue
            ident = who.email.lower() or who.name.lower()
            if ident not in seen:
                seen.add(ident)
                approved.append(who.display())
        if len(approved) >= policy.required:
            return Approval(True, tuple(approved), pr, via="trailers")

    would = tuple(o for o in eligible if o.lower() not in authors and ("@" + o.lower().lstrip("@")) not in authors)
    if policy.mode == "merge-commit":
        reason = "not approved: no merged pull request recorded in the merge commit"
    elif not eligible:
        reason = f"not approved: nobody may approve {path} (no CODEOWNERS entry and no approvers in policy)"
    else:
        need = policy.required - len(approved)
        reason = f"not approved: needs {need} more approval(s) from {', '.join(would) or 'an approver other than the author'}"
        if policy.mode == "either":
            reason += " or a merged pull request"
    return Approval(False, tuple(approved), pr, reason, would)
