"""CODEOWNERS as GitHub reads it: who owns a path. Pure: text in, owners out.

Matching is the `codeowners` library's (a port of hmarr/codeowners, which implements
GitHub's gitignore-style rules); this module adds what GitHub does around it:
- the last matching line wins, and a line with no owners makes the path ownerless;
- `*.js` matches anywhere; `/build/logs/` is the root's build/logs and everything below;
  `docs/*` only the direct children of docs/ (a slash before the end anchors the pattern
  to the root, as in .gitignore); `apps/` any `apps` directory; `**/logs` any logs directory;
- a line GitHub calls invalid is skipped, and reported here with its line: `!` negation,
  `[ ]` character ranges (GitHub: "do not work"), an owner that is not `@user`,
  `@org/team` or an e-mail address;
- `#` starts a comment at the start of a line or after a blank (`*.js @o #note`).

Owners are returned as written (`@alice`, `@lab/tpu-stewards`, `bob@lab.example`); who is in
a team is the policy's `teams` section (`ledger.spec.policy.Teams`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from codeowners import CodeOwners

from ledger.spec.model import Message
from ledger.spec.policy import Teams, unknown_team_problem

_USER = re.compile(r"^@[A-Za-z0-9](?:[A-Za-z0-9_.-]*)$")
_TEAM = re.compile(r"^@[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
_INLINE_COMMENT = re.compile(r"\s#.*$")


def owner_kind(owner: str) -> str | None:
    """"team" (@org/team), "user" (@user), "email", or None when GitHub would refuse it."""
    if _TEAM.match(owner):
        return "team"
    if _USER.match(owner):
        return "user"
    if _EMAIL.match(owner):
        return "email"
    return None


@dataclass(frozen=True, slots=True)
class Rule:
    pattern: str
    owners: tuple[str, ...]
    line: int
    columns: tuple[int, ...] = ()  # 1-based column of each owner on its line


@dataclass(frozen=True, slots=True)
class CodeOwnersFile:
    """One CODEOWNERS file: its valid rules and the lines GitHub would skip."""

    file: str
    rules: tuple[Rule, ...]
    problems: tuple[Message, ...]
    matcher: CodeOwners

    def rule_for(self, path: str) -> Rule | None:
        """The rule that decides `path`: the last matching one."""
        _, line, _, _ = self.matcher.matching_line(path)
        if line is None:
            return None
        return next(r for r in self.rules if r.line == line)

    def owners(self, path: str) -> tuple[str, ...]:
        rule = self.rule_for(path)
        return rule.owners if rule is not None else ()


def _columns(raw: str, owners: list[str]) -> tuple[int, ...]:
    out, at = [], raw.find(" ")
    for owner in owners:
        at = raw.find(owner, at)
        out.append(at + 1)
        at += len(owner)
    return tuple(out)


def team_problems(owners: CodeOwnersFile, teams: Teams) -> list[Message]:
    """Each `@org/team` the policy's `teams` does not define, at its line: nobody could
    approve for it."""
    out = []
    for rule in owners.rules:
        for owner, column in zip(rule.owners, rule.columns, strict=True):
            if teams.unknown(owner):
                message, hint = unknown_team_problem(owner)
                out.append(Message(owners.file, rule.line, column, "", message, hint, "error"))
    return out


def _skip(file: str, number: int, column: int, message: str, hint: str) -> Message:
    return Message(file, number, column, "", f"{message}; GitHub skips this line", hint, "error")


@functools.lru_cache(maxsize=32)
def parse_codeowners(text: str, file: str = "CODEOWNERS") -> CodeOwnersFile:
    """The rules of `text` (the watcher asks for the same few texts at every commit: cached)."""
    rules: list[Rule] = []
    problems: list[Message] = []
    kept: list[str] = []  # the valid lines, others blanked, so the library's line numbers are ours
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("#"):
            line = ""
        line = _INLINE_COMMENT.sub("", line).strip()
        if not line or (line.startswith("[") or line.startswith("^[")) and line.endswith("]"):
            kept.append(line)  # blank, comment, or a GitLab section header (the library knows them)
            continue
        pattern, *owners = line.replace("\\ ", "\x00").split()
        pattern = pattern.replace("\x00", "\\ ")
        column = raw.find(pattern[:1]) + 1
        bad_owner = next((o for o in owners if owner_kind(o) is None), None)
        if pattern.startswith("!"):
            problems.append(_skip(file, number, column, f"`{pattern}`: negation with `!` does not work in CODEOWNERS",
                                  "list the owners of the exception on a later line instead"))
        elif "[" in pattern or "]" in pattern:
            problems.append(_skip(file, number, column, f"`{pattern}`: character ranges `[ ]` do not work in CODEOWNERS",
                                  "write one line per name"))
        elif bad_owner is not None:
            problems.append(_skip(file, number, raw.find(bad_owner) + 1,
                                  f"{bad_owner!r} is not an owner: use @user, @org/team or an e-mail address",
                                  "fix the owner or remove it"))
        else:
            rules.append(Rule(pattern, tuple(owners), number, _columns(raw, owners)))
            kept.append(line)
            continue
        kept.append("")
    return CodeOwnersFile(file, tuple(rules), tuple(problems), CodeOwners("\n".join(kept)))
