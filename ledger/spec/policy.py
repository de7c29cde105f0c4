"""`.ledger/policy.yaml`: read once into a typed, frozen `Policy`.

The only reader of the file. `ledger validate`, job validation (defaults, limits, ignore),
the watcher and `ledger plan` (approval) and `ledger notify` (notify) all take their
section from here, parsed through the hardened YAML loader and `policy.schema.json`, so
that every problem is reported as `file:line:column` and unknown keys are refused.

    policy, errors = parse_policy(text)           # text of the file (None: no file)
    policy.approval.mode, policy.notify.owners["alice"].email, policy.ignore.matches(path)
    load_policy(path)                             # a file; LedgerError on any problem

**Sections.** Each top-level key of the file is one frozen dataclass, a *section*, and one
field of `Policy` of the same name. A section
- is built by `from_data(data)` from its block as checked by the schema, with the schema's
  `default`s filled in (the defaults are written once, in the schema);
- is `default()` when the file has no such block (the empty block, defaults filled);
- may report `problems(policy)` the schema cannot express (an unknown TPU type; a
  reference to another section, such as a quota's team), each at its line;
- is `fallback()` when its block is broken (by the schema or by its own problems): the
  defaults, unless the section knows a safer answer (approval falls back to the strict
  `trailers` rule). A broken block never takes the other sections with it.

**Adding a section** (teams, quotas, priority classes, prices...): a block in
`policy.schema.json` (with `additionalProperties: false`, so unknown keys are refused with
their line), a `Section` dataclass here with `KEY` and `from_data`, and a field on `Policy`
declared with `section(TheClass)`. `tests/spec/test_policy_model.py` checks that the
schema's blocks and the model's sections are the same set.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, Self

from ledger import tpu_types
from ledger.errors import LedgerError, UsageError
from ledger.resources import load_schema
from ledger.spec.document import check_document, read_bounded
from ledger.spec.layout import POLICY_PATH
from ledger.spec.model import Message
from ledger.spec.schema import Problem, fill_defaults

SCHEMA = "policy"


def _filled(key: str, block: Any) -> Any:
    """`block` as the value of `key` with the schema's defaults filled in."""
    return fill_defaults(SCHEMA, {key: block})[key]


def _empty(key: str) -> Any:
    """The empty block of `key`, by the schema's type of it ([] for a list, else {})."""
    return [] if load_schema(SCHEMA)["properties"][key].get("type") == "array" else {}


class Section:
    """A top-level block of policy.yaml. Subclasses are frozen dataclasses with a `KEY`."""

    __slots__ = ()
    KEY: ClassVar[str]

    @classmethod
    def from_data(cls, data: Any) -> Self:
        """The section from its schema-valid block, defaults filled."""
        raise NotImplementedError

    @classmethod
    def default(cls) -> Self:
        """The section of a file that does not have this block."""
        return cls.from_data(_filled(cls.KEY, _empty(cls.KEY)))

    @classmethod
    def fallback(cls) -> Self:
        """The section when the file's block is broken (reported as errors)."""
        return cls.default()

    def problems(self, policy: Policy) -> Iterable[Problem]:
        """What the schema cannot say is wrong (an unknown TPU type, a reference to another
        section); pointers are the file's, so each problem gets its line. Any problem
        breaks the block: it falls back like a block the schema refused."""
        return ()


def section(cls: type[Section]) -> Any:
    """A `Policy` field holding the section `cls` (its name must be `cls.KEY`)."""
    return field(default_factory=cls.default, metadata={"section": cls})


# -- approval and teams -------------------------------------------------------------------
def team_key(handle: str) -> str:
    """A team handle as the policy's `teams` keys it: `@org/team`, lowercased (GitHub's
    handles are case-insensitive)."""
    return "@" + handle.strip().lstrip("@").lower()


def is_team_handle(handle: str) -> bool:
    """`@org/team` is a team by its spelling (GitHub's); `@name` may be a user or a team."""
    return handle.startswith("@") and "/" in handle


@dataclass(frozen=True, slots=True)
class Teams(Section):
    """Who is in each team that CODEOWNERS or `approval.approvers` names.

        teams:
          "@lab/tpu-stewards": [Sam Steward, sam@lab.example, "@sam"]

    A member is a name, an e-mail address or an @handle; one person may be listed by
    several of them. A member's approval counts for the team.
    """

    KEY: ClassVar[str] = "teams"
    members: Mapping[str, tuple[str, ...]]  # team_key(handle) -> members

    @classmethod
    def from_data(cls, data: Any) -> Self:
        return cls(members=MappingProxyType({team_key(k): tuple(str(m).strip() for m in v) for k, v in data.items()}))

    def of(self, handle: str) -> tuple[str, ...] | None:
        """The members of `handle` when it is a team of the policy, else None."""
        return self.members.get(team_key(handle)) if handle.startswith("@") else None

    def unknown(self, handle: str) -> bool:
        """An `@org/team` handle the policy does not define: nobody can approve for it."""
        return is_team_handle(handle) and team_key(handle) not in self.members


def unknown_team_problem(handle: str) -> tuple[str, str]:
    """(message, hint) for a team handle the policy does not define."""
    return (f"{handle} is a team the policy does not define: nobody can approve for it",
            f"add it to `teams:` in {POLICY_PATH} with its members (names, e-mails or @handles)")


@dataclass(frozen=True, slots=True)
class ApprovalPolicy(Section):
    """What counts as approval of a change on the protected branch (ledger.gitops.approval).

    `mode`: trailers | merge-commit | either; `required`: distinct approvers needed with
    trailers; `approvers`: who may approve, None = the CODEOWNERS owners of the path (a
    team handle in either means its members, from `teams`); `signatures`: a merge or an
    approval counts only with a good signature by a key of ALLOWED_SIGNERS_PATH.
    """

    KEY: ClassVar[str] = "approval"
    mode: str
    required: int
    approvers: tuple[str, ...] | None
    signatures: bool = False

    @classmethod
    def from_data(cls, data: Any) -> Self:
        listed = data["approvers"]
        approvers = None if listed == "codeowners" else tuple(str(a).strip() for a in listed)
        return cls(mode=data["mode"], required=data["required"], approvers=approvers,
                   signatures=data["signatures"] == "required")

    @classmethod
    def fallback(cls) -> Self:
        # A broken block does not say whether the host's merge button can be trusted: only
        # explicit approvals count until the file is fixed (the fix needs them too).
        # Signatures stay off: requiring them could lock out a branch without an
        # allowed-signers file, and the broken block was itself approved under the old rules.
        return replace(cls.default(), mode="trailers")

    def problems(self, policy: Policy) -> Iterable[Problem]:
        for i, handle in enumerate(self.approvers or ()):
            if policy.teams.unknown(handle):
                yield Problem(f"/approval/approvers/{i}", *unknown_team_problem(handle))


# -- notify -------------------------------------------------------------------------------
CHANNELS = ("webhook", "email")  # the schema's notify.owners.*.opt_out items


@dataclass(frozen=True, slots=True)
class NotifyOwner:
    """How to reach a job owner, and which channels they do not want (no entry: none)."""

    email: str | None = None
    opt_out: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class NotifyPolicy(Section):
    """Who hears about what (`ledger notify`). A job's owner is the first part of its id.

        notify:
          webhook: https://hooks.slack.com/services/...   # optional; --webhook overrides
          from: tpu-ledger@example.org                     # optional sender address
          events: [rejected, quarantined, preempted, failed, finished, cancelled]   # optional, the default
          owners:
            alice: {email: alice@example.org}
            bob: {email: bob@example.org, opt_out: true}          # no messages about bob's jobs
            carol: {email: carol@example.org, opt_out: [email]}   # webhook yes, email no
    """

    KEY: ClassVar[str] = "notify"
    webhook: str | None
    sender: str
    events: frozenset[str]
    owners: Mapping[str, NotifyOwner]

    @classmethod
    def from_data(cls, data: Any) -> Self:
        owners = {}
        for name, prefs in (data.get("owners") or {}).items():
            opt = prefs["opt_out"]
            channels = frozenset(CHANNELS) if opt is True else frozenset(opt or ())
            owners[name] = NotifyOwner(email=prefs.get("email"), opt_out=channels)
        return cls(webhook=data.get("webhook"), sender=data["from"], events=frozenset(data["events"]),
                   owners=MappingProxyType(owners))

    def owner(self, name: str | None) -> NotifyOwner:
        return self.owners.get(name or "", NotifyOwner())


# -- defaults, limits, ignore -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Defaults(Section):
    """A job-spec fragment laid under every job (the job's own values win).

    `spec` is read-only at the top; the values below are the parsed data, shared by every
    user of this Policy: copy before changing them (job validation deep-copies).
    """

    KEY: ClassVar[str] = "defaults"
    spec: Mapping[str, Any]

    @classmethod
    def from_data(cls, data: Any) -> Self:
        return cls(spec=MappingProxyType(copy.deepcopy(dict(data))))


@dataclass(frozen=True, slots=True)
class Limits(Section):
    """Bounds every job must stay within; None / empty = no bound."""

    KEY: ClassVar[str] = "limits"
    max_restarts: int | None
    max_priority: int | None
    accelerators: tuple[str, ...]
    zones: tuple[str, ...]

    @classmethod
    def from_data(cls, data: Any) -> Self:
        return cls(max_restarts=data.get("max_restarts"), max_priority=data.get("max_priority"),
                   accelerators=tuple(data.get("accelerators") or ()), zones=tuple(data.get("zones") or ()))

    def problems(self, policy: Policy) -> Iterable[Problem]:
        for i, name in enumerate(self.accelerators):
            if tpu_types.lookup(name) is None:
                # a typo here would quietly forbid the type every job asks for
                yield Problem(f"/limits/accelerators/{i}", f"`limits.accelerators` lists {name!r}, "
                              "which is not a Cloud TPU type", "use a type such as v4-8 or v5litepod-16")


@dataclass(frozen=True, slots=True)
class Ignore(Section):
    """Globs of job files that are validated but never run (e.g. jobs/examples/*)."""

    KEY: ClassVar[str] = "ignore"
    globs: tuple[str, ...]

    @classmethod
    def from_data(cls, data: Any) -> Self:
        return cls(globs=tuple(data))

    def matches(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, g) for g in self.globs)


# -- prices -------------------------------------------------------------------------------
PRICING_MODELS = ("spot", "ondemand", "preemptible", "reserved")  # the job spec's tpu.pricing


@dataclass(frozen=True, slots=True)
class PriceTable(Section):
    """USD per chip-hour by accelerator family and pricing model; nothing when not given.

        prices:
          v4: {spot: 1.00, ondemand: 3.00}     # example numbers: put your own
          v5litepod: {ondemand: 1.00}

    The watcher records the table in a `policy_changed` event whenever the file changes,
    so `ledger usage` prices each interval with the table in force when it happened.
    """

    KEY: ClassVar[str] = "prices"
    usd: Mapping[tuple[str, str], float]  # (family, pricing) -> USD per chip-hour

    @classmethod
    def from_data(cls, data: Any) -> Self:
        return cls(usd=MappingProxyType({(family, pricing): float(value) for family, models in sorted(data.items())
                                         for pricing, value in sorted(models.items())}))

    def rate(self, family: str, pricing: str) -> float | None:
        return self.usd.get((family, pricing))

    def problems(self, policy: Policy) -> Iterable[Problem]:
        known = {t.family for t in tpu_types.all_types()}
        for family in sorted({f for f, _ in self.usd}):
            if family not in known:
                # a typo here would leave every cost of the real family unknown
                yield Problem(f"/prices/{family}", f"`prices` names {family!r}, which is not a Cloud TPU family",
                              f"use one of {', '.join(sorted(known))}")


# -- the policy ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Policy:
    """`.ledger/policy.yaml`, every section typed; `Policy()` is the policy of no file."""

    approval: ApprovalPolicy = section(ApprovalPolicy)
    teams: Teams = section(Teams)
    notify: NotifyPolicy = section(NotifyPolicy)
    defaults: Defaults = section(Defaults)
    limits: Limits = section(Limits)
    ignore: Ignore = section(Ignore)
    prices: PriceTable = section(PriceTable)


SECTIONS: dict[str, type[Section]] = {f.name: f.metadata["section"] for f in fields(Policy)}


class ParsedPolicy(NamedTuple):
    policy: Policy
    errors: tuple[Message, ...]  # what is wrong with the file; broken blocks fell back


@functools.lru_cache(maxsize=64)
def parse_policy(text: str | bytes | None, *, file: str = POLICY_PATH) -> ParsedPolicy:
    """The policy in `text` (None or empty: no file), and its problems as file:line:column.

    Pure and cached: the watcher asks for the same few texts at every commit.
    """
    checked = check_document(text, file, SCHEMA)
    errors = list(checked.errors)
    broken = _broken(errors)
    blocks = {key: checked.data.get(key, _empty(key)) for key in SECTIONS if key not in broken}
    filled = fill_defaults(SCHEMA, blocks)
    values = {key: cls.fallback() if key in broken else cls.from_data(filled[key]) for key, cls in SECTIONS.items()}
    policy = Policy(**values)
    later = [checked.message(file, p) for key, value in values.items() if key not in broken
             for p in value.problems(policy)]
    if later:
        errors += later
        policy = replace(policy, **{key: SECTIONS[key].fallback() for key in _broken(later)})
    return ParsedPolicy(policy, tuple(sorted(errors, key=lambda m: (m.line, m.column))))


def _broken(errors: Iterable[Message]) -> set[str]:
    """The top-level blocks the errors are in; all of them for an error about the whole file."""
    broken: set[str] = set()
    for m in errors:
        broken.update(SECTIONS if not m.pointer else {m.pointer.split("/")[1]})
    return broken & set(SECTIONS)


def load_policy(path: str | Path) -> Policy:
    """The policy file at `path`, refused whole (LedgerError, file:line:column) when it has
    any problem: a daemon started with a policy should run with all of it."""
    path = Path(path)
    try:
        text = read_bounded(path)
    except OSError as exc:
        raise UsageError(f"cannot read policy {path}: {exc.strerror}", hint="pass --policy PATH") from exc
    if text is None:
        raise UsageError(f"no policy file at {path}", hint="pass --policy PATH of a .ledger/policy.yaml")
    policy, errors = parse_policy(text, file=str(path))
    if errors:
        first = errors[0]
        hints = [first.hint] if first.hint else []
        if len(errors) > 1:
            hints.append(f"{len(errors) - 1} more problem(s) in the file: `ledger validate` lists them")
        raise LedgerError(f"{first.file}:{first.line}:{first.column}: {first.message}",
                          hint="; ".join(hints) or "fix the policy file")
    return policy
