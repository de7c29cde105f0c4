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
import json
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
    # GitHub's web-flow OpenPGP signature on a merge it made counts as a signed merge
    web_flow: bool = False
    # a merged pull request counts only with `required` approving forge reviews on its head
    reviews_required: bool = False

    @classmethod
    def from_data(cls, data: Any) -> Self:
        listed = data["approvers"]
        approvers = None if listed == "codeowners" else tuple(str(a).strip() for a in listed)
        return cls(mode=data["mode"], required=data["required"], approvers=approvers,
                   signatures=data["signatures"] == "required", web_flow=data["web_flow"] == "accepted",
                   reviews_required=data["reviews"] == "required")

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


@dataclass(frozen=True, slots=True)
class Delegates(Section):
    """Who may submit jobs under another owner's folder, with that owner's secrets and quota.

        delegates:
          bob: ["@alice", carol@lab.example]     # alice and carol may submit jobs/bob/...
          "*": ["@lab/tpu-admins"]                # the admins may submit for anyone

    Without an entry only the owner may: a job under jobs/<owner>/ runs only when <owner>
    wrote or approved the change (ledger.gitops.approval.tenancy_problem).
    """

    KEY: ClassVar[str] = "delegates"
    of_owner: Mapping[str, tuple[str, ...]]  # owner ("*": anyone) -> people and team handles

    @classmethod
    def from_data(cls, data: Any) -> Self:
        return cls(of_owner=MappingProxyType({k: tuple(str(m).strip() for m in v) for k, v in data.items()}))

    def of(self, owner: str) -> tuple[str, ...]:
        """The delegates of `owner`: its own entry and the `*` entry."""
        return tuple(dict.fromkeys((*self.of_owner.get(owner, ()), *self.of_owner.get("*", ()))))

    def problems(self, policy: Policy) -> Iterable[Problem]:
        for owner, entries in self.of_owner.items():
            for i, handle in enumerate(entries):
                if policy.teams.unknown(handle):
                    yield Problem(f"/delegates/{_escape(owner)}/{i}", *unknown_team_problem(handle))


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


# -- sharing a lab's TPUs: quotas, priority classes, fair share ---------------------------
@dataclass(frozen=True, slots=True)
class Quota:
    """One holder's limits: concurrent chips and chip-hours over a rolling week, by family
    (`ledger.tpu_types` names: v4, v5litepod, ...). A family not listed is not limited."""

    chips: Mapping[str, int] = field(default_factory=dict)
    chip_hours_per_week: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_data(cls, data: Any) -> Quota:
        def by_family(block: Any) -> Mapping[str, Any]:
            return MappingProxyType({tpu_types.family_named(k) or k: v for k, v in (block or {}).items()})

        return cls(chips=by_family(data.get("chips")), chip_hours_per_week=by_family(data.get("chip_hours_per_week")))

    def families(self) -> Iterable[tuple[str, str]]:
        """(field, family as written) of every entry, for problems() at the entry's line."""
        return ((f, k) for f in ("chips", "chip_hours_per_week") for k in getattr(self, f))


@dataclass(frozen=True, slots=True)
class Quotas(Section):
    """Who may hold how much (reconciler.admission enforces it).

        quotas:
          lab: {chips: {v4: 256, v5e: 64}}
          teams:
            "@lab/vision": {chips: {v4: 128}}
          users:
            alice: {chips: {v4: 64}, chip_hours_per_week: {v4: 4000}}
          default_user: {chips: {v4: 32}}
    """

    KEY: ClassVar[str] = "quotas"
    lab: Quota | None = None
    teams: Mapping[str, Quota] = field(default_factory=dict)  # team_key(handle) -> quota
    users: Mapping[str, Quota] = field(default_factory=dict)
    default_user: Quota | None = None
    borrowing: bool = False  # teams lend each other their idle chips (a cohort, as Kueue's)
    on_spent: str = "finish"  # a running job whose weekly quota runs out: finish | checkpoint-and-stop
    _raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_data(cls, data: Any) -> Self:
        def one(block: Any) -> Quota | None:
            return None if block is None else Quota.from_data(block)

        return cls(
            lab=one(data.get("lab")),
            teams=MappingProxyType({team_key(k): Quota.from_data(v) for k, v in (data.get("teams") or {}).items()}),
            users=MappingProxyType({k: Quota.from_data(v) for k, v in (data.get("users") or {}).items()}),
            default_user=one(data.get("default_user")), borrowing=bool(data.get("borrowing", False)),
            on_spent=str(data.get("on_spent", "finish")), _raw=MappingProxyType(dict(data)),
        )

    @property
    def any(self) -> bool:
        return bool(self.lab or self.teams or self.users or self.default_user)

    def of_user(self, owner: str) -> Quota | None:
        return self.users.get(owner, self.default_user)

    def problems(self, policy: Policy) -> Iterable[Problem]:
        raw = self._raw
        places: list[tuple[str, Any]] = [("/quotas/lab", raw.get("lab")), ("/quotas/default_user", raw.get("default_user"))]
        places += [(f"/quotas/teams/{_escape(k)}", v) for k, v in (raw.get("teams") or {}).items()]
        places += [(f"/quotas/users/{_escape(k)}", v) for k, v in (raw.get("users") or {}).items()]
        for ptr, block in places:
            for fld in ("chips", "chip_hours_per_week"):
                for fam in (block or {}).get(fld) or {}:
                    if tpu_types.family_named(fam) is None:
                        yield Problem(f"{ptr}/{fld}/{_escape(fam)}", f"{fam!r} is not an accelerator family",
                                      f"use one of {', '.join(tpu_types.FAMILIES)} (or v5e)")
        for handle in raw.get("teams") or {}:
            if team_key(handle) not in policy.teams.members:
                yield Problem(f"/quotas/teams/{_escape(handle)}", f"quota for {handle}, a team the policy does not define",
                              f"add it to `teams:` in {POLICY_PATH} with its members")

    def teams_of(self, owner: str, teams: Teams) -> tuple[str, ...]:
        """The quota'd teams `owner` is a member of (by name or @handle, case-insensitive)."""
        me = {owner.lower(), "@" + owner.lower()}
        return tuple(t for t in self.teams if me & {m.lower() for m in teams.members.get(t, ())})


def _escape(key: str) -> str:
    """A key as a JSON pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True, slots=True)
class Priorities(Section):
    """Priority classes over the job spec's 0-1000 priority, and who may preempt whom.

        priorities:
          classes: {low: 100, normal: 500, urgent: 900}
          preempt: {urgent: [low]}     # an urgent job that cannot start may preempt low jobs
          spot_for_on_demand: true     # an on-demand job may preempt a spot job of a lower class
    """

    KEY: ClassVar[str] = "priorities"
    classes: tuple[tuple[str, int], ...]  # (name, value), by value ascending
    preempt: Mapping[str, frozenset[str]]
    spot_for_on_demand: bool = False

    @classmethod
    def from_data(cls, data: Any) -> Self:
        classes = tuple(sorted(data["classes"].items(), key=lambda kv: (kv[1], kv[0])))
        preempt = {k: frozenset(v) for k, v in data["preempt"].items()}
        return cls(classes=classes, preempt=MappingProxyType(preempt), spot_for_on_demand=data["spot_for_on_demand"])

    def class_of(self, priority: int) -> tuple[str, int]:
        """(name, value) of the highest class at most `priority` (the lowest class below all)."""
        found = self.classes[0] if self.classes else ("", 0)
        for name, value in self.classes:
            if value <= priority:
                found = (name, value)
        return found

    def may_preempt(self, winner: int, victim: int, *, victim_spot: bool = False, winner_spot: bool = False) -> bool:
        """May a job of priority `winner` preempt a running one of priority `victim`? Never a
        job of its own or a higher class."""
        (wname, wvalue), (vname, vvalue) = self.class_of(winner), self.class_of(victim)
        if vvalue >= wvalue:
            return False
        if vname in self.preempt.get(wname, ()):
            return True
        return self.spot_for_on_demand and victim_spot and not winner_spot

    @property
    def preempts(self) -> bool:
        return bool(self.preempt) or self.spot_for_on_demand

    def problems(self, policy: Policy) -> Iterable[Problem]:
        values = dict(self.classes)
        for winner, victims in sorted(self.preempt.items()):
            if winner not in values:
                yield Problem(f"/priorities/preempt/{winner}", f"{winner!r} is not a priority class",
                              f"classes are {', '.join(values)}")
                continue
            for victim in sorted(victims):
                if victim not in values:
                    yield Problem(f"/priorities/preempt/{winner}", f"{victim!r} is not a priority class",
                                  f"classes are {', '.join(values)}")
                elif values[victim] >= values[winner]:
                    yield Problem(f"/priorities/preempt/{winner}", f"{winner} may not preempt {victim}: "
                                  "a job never preempts one of its own or a higher class", f"list only classes below {winner}")


@dataclass(frozen=True, slots=True)
class FairShare(Section):
    """The fair tree's weights (lab -> team -> user, as Slurm's fair tree) and how fast past
    usage is forgotten (Slurm's decay half-life).

        fair_share:
          half_life_hours: 168
          teams: {"@lab/nlp": 2, "@lab/vision": 1}   # unset: every team of `teams`, weight 1
          users: {alice: 2}                         # within her team; default 1
          no_team: 1                                # the users in no team, as one group
    """

    KEY: ClassVar[str] = "fair_share"
    half_life_hours: float
    teams: Mapping[str, float] | None = None  # team_key(handle) -> weight; None: every team, weight 1
    users: Mapping[str, float] = field(default_factory=dict)
    no_team: float = 1.0

    @classmethod
    def from_data(cls, data: Any) -> Self:
        teams = data.get("teams")
        return cls(half_life_hours=float(data["half_life_hours"]),
                   teams=None if teams is None else MappingProxyType({team_key(k): float(v) for k, v in teams.items()}),
                   users=MappingProxyType({k: float(v) for k, v in (data.get("users") or {}).items()}),
                   no_team=float(data.get("no_team", 1)))

    def weights(self, teams: Teams) -> dict[str, float]:
        """Team -> its weight in the tree: the listed teams, or every team of `teams`."""
        if self.teams is None:
            return {t: 1.0 for t in teams.members}
        return dict(self.teams)

    def team_by_member(self, teams: Teams) -> dict[str, str]:
        """Member (a name or @handle, lowercased, without its @) -> their team in the tree:
        the first by name of the weighted teams that list them. An owner is looked up by
        their name, lowercased."""
        found: dict[str, str] = {}
        for t in sorted(self.weights(teams), reverse=True):  # the first by name wins: written last
            for m in teams.members.get(t, ()):
                found[m.lower().removeprefix("@")] = t
        return found

    def problems(self, policy: Policy) -> Iterable[Problem]:
        for handle in self.teams or {}:
            if team_key(handle) not in policy.teams.members:
                yield Problem(f"/fair_share/teams/{_escape(handle)}", f"a weight for {handle}, a team the policy does not define",
                              f"add it to `teams:` in {POLICY_PATH} with its members")


@dataclass(frozen=True, slots=True)
class Overrides(Section):
    """The admins' overrides (`ledger cancel`, `admit`, `resume`, `rerun`): `signatures`
    required = each must be signed by a key of ALLOWED_SIGNERS_PATH (ledger.overrides)."""

    KEY: ClassVar[str] = "overrides"
    signatures: bool = False

    @classmethod
    def from_data(cls, data: Any) -> Self:
        return cls(signatures=data["signatures"] == "required")


def sharing_blocks(policy: Policy) -> dict[str, Any]:
    """The blocks admission reads, and whether overrides must be signed, as plain data that
    `sharing_policy` reads back (what the ledger records: no webhook, no address, nothing but
    the rules every reconciler and `ledger cancel` follow)."""
    def quota(q: Quota | None) -> dict[str, Any] | None:
        return None if q is None else {"chips": dict(q.chips), "chip_hours_per_week": dict(q.chip_hours_per_week)}

    q = policy.quotas
    quotas: dict[str, Any] = {"teams": {k: quota(v) for k, v in q.teams.items()},
                              "users": {k: quota(v) for k, v in q.users.items()},
                              "borrowing": q.borrowing, "on_spent": q.on_spent}
    quotas.update({k: v for k, v in (("lab", quota(q.lab)), ("default_user", quota(q.default_user))) if v is not None})
    p = policy.priorities
    fs = policy.fair_share
    fair_share: dict[str, Any] = {"half_life_hours": fs.half_life_hours, "users": dict(fs.users), "no_team": fs.no_team}
    if fs.teams is not None:
        fair_share["teams"] = dict(fs.teams)
    named = q.teams.keys() | fs.weights(policy.teams).keys()
    return {
        "teams": {k: list(v) for k, v in policy.teams.members.items() if k in named},
        "quotas": quotas,
        "priorities": {"classes": dict(p.classes), "preempt": {k: sorted(v) for k, v in p.preempt.items()},
                       "spot_for_on_demand": p.spot_for_on_demand},
        "fair_share": fair_share,
        # Only when required, so the rules (and digests) of ledgers that never asked stay as they were.
        **({"overrides": {"signatures": "required"}} if policy.overrides.signatures else {}),
    }


def sharing_policy(blocks: Mapping[str, Any]) -> Policy:
    """A Policy with the sharing rules of `blocks` (from `sharing_blocks`) and defaults elsewhere."""
    return parse_policy(json.dumps(dict(blocks), sort_keys=True), file="(recorded policy)").policy


# -- the policy ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Policy:
    """`.ledger/policy.yaml`, every section typed; `Policy()` is the policy of no file."""

    approval: ApprovalPolicy = section(ApprovalPolicy)
    teams: Teams = section(Teams)
    delegates: Delegates = section(Delegates)
    notify: NotifyPolicy = section(NotifyPolicy)
    defaults: Defaults = section(Defaults)
    limits: Limits = section(Limits)
    ignore: Ignore = section(Ignore)
    prices: PriceTable = section(PriceTable)
    quotas: Quotas = section(Quotas)
    priorities: Priorities = section(Priorities)
    fair_share: FairShare = section(FairShare)
    overrides: Overrides = section(Overrides)


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
