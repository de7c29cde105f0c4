"""The fair tree: lab -> team -> user, in the spirit of Slurm's fair tree. Pure.

At each level the siblings are ranked by their *level fair share* `S / U`: their weight's
share among the siblings (`S`, from `fair_share.teams`, `fair_share.users`) over their
decayed usage's share among them (`U`, chip-hours held, halved every half-life: the usage
fold's `ShareMeter`). A sibling with no usage ranks above any with some; one with weight 0
below any with weight. A depth-first walk then gives every user a rank: all the users of the
first team, in their own order, before the users of the next. Admission orders the waiting
jobs of one priority by their owner's rank, so a lab shares by team first (a heavy team's
light user waits behind a light team's heavy one), then by user within a team.

Each user belongs to one team of the tree: the first by name of the weighted teams that list
them (`FairShare.team_by_member`); the users of none form the group `NO_TEAM`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ledger.spec.policy import Policy

NO_TEAM = "(no team)"


@dataclass(frozen=True, slots=True)
class Level:
    """One node of the tree as `ledger queue` and the dashboard show it."""

    level: str  # "lab" | "team" | "user"
    name: str
    parent: str  # the team of a user, "lab" for a team, "" for the lab
    weight: float
    share: float  # the weight's share among the siblings (S), 0-1
    usage: float  # decayed chip-hours
    usage_share: float  # the usage's share among the siblings (U), 0-1
    rank: int  # 1 = first among its siblings (a user: first in the whole lab)

    @property
    def fair_share(self) -> float:
        """S / U (infinite with no usage): who is owed the most goes first."""
        return _ratio(self.share, self.usage_share)

    def to_json(self) -> dict[str, object]:
        factor = self.fair_share
        return {"level": self.level, "name": self.name, "parent": self.parent, "weight": self.weight,
                "share": self.share, "usage": self.usage, "usage_share": self.usage_share,
                "fair_share": None if math.isinf(factor) else factor, "rank": self.rank}


@dataclass(slots=True)
class FairTree:
    levels: list[Level] = field(default_factory=list)  # the lab, then each team and its users, in rank order
    rank: dict[str, int] = field(default_factory=dict)  # owner -> rank in the lab (0 first)
    team: dict[str, str] = field(default_factory=dict)  # owner -> their team in the tree

    def rank_of(self, owner: str) -> int:
        """An owner the tree was not built with goes after every one it was."""
        return self.rank.get(owner, len(self.rank))


def _ratio(share: float, usage_share: float) -> float:
    if share <= 0:
        return 0.0
    return math.inf if usage_share <= 0 else share / usage_share


def _ranked(names: Iterable[str], weights: Mapping[str, float], usage: Mapping[str, float]) -> list[tuple[str, float, float, float]]:
    """(name, S, U, weight) of siblings, by S/U descending; ties by weight, then name."""
    names = list(names)
    total_w = sum(weights[n] for n in names)
    total_u = sum(usage[n] for n in names)
    rows = [(n, weights[n] / total_w if total_w else 0.0, usage[n] / total_u if total_u else 0.0, weights[n]) for n in names]
    rows.sort(key=lambda r: (-_ratio(r[1], r[2]), -r[3], r[0]))
    return rows


def fair_tree(policy: Policy, decayed: Mapping[str, float], owners: Iterable[str] = ()) -> FairTree:
    """The tree over the owners with usage and `owners` (those with jobs in the queue)."""
    fs = policy.fair_share
    team_weights = fs.weights(policy.teams)
    by_member = fs.team_by_member(policy.teams)
    members: dict[str, list[str]] = {}
    tree = FairTree()
    for owner in sorted({*decayed, *owners}):
        team = by_member.get(owner.lower(), NO_TEAM)
        tree.team[owner] = team
        members.setdefault(team, []).append(owner)
    weights = {t: team_weights.get(t, fs.no_team) for t in members}
    usage = {t: sum(max(decayed.get(o, 0.0), 0.0) for o in ms) for t, ms in members.items()}
    tree.levels.append(Level("lab", "lab", "", 1.0, 1.0, sum(usage.values()), 1.0, 1))
    for team_rank, (team, share, ushare, weight) in enumerate(_ranked(members, weights, usage), 1):
        tree.levels.append(Level("team", team, "lab", weight, share, usage[team], ushare, team_rank))
        users = {o: fs.users.get(o, 1.0) for o in members[team]}
        used = {o: max(decayed.get(o, 0.0), 0.0) for o in members[team]}
        for owner, share, ushare, weight in _ranked(users, users, used):
            tree.rank[owner] = len(tree.rank)
            tree.levels.append(Level("user", owner, team, weight, share, used[owner], ushare, len(tree.rank)))
    return tree
