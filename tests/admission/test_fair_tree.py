"""The fair tree (ledger.usage.fairtree): its ranks, and over simulated days, that teams
share a full lab by their weights and that no team with a weight above 0 starves."""

from __future__ import annotations

import math
from pathlib import Path

from ledger.spec.policy import Policy, load_policy, parse_policy
from ledger.usage.fairtree import NO_TEAM, fair_tree
from tests.admission.sim import World

TEAMS = """\
teams:
  "@lab/nlp": [alice, bob]
  "@lab/vision": [carol]
  "@lab/stewards": [sam]
"""


def policy(text: str) -> Policy:
    parsed, errors = parse_policy(text)
    assert errors == (), [m.format() for m in errors]
    return parsed


def test_teams_rank_by_share_over_usage_then_users_within_them():
    p = policy(TEAMS + 'fair_share:\n  teams: {"@lab/nlp": 2, "@lab/vision": 1}\n  users: {bob: 3}\n')
    tree = fair_tree(p, {"alice": 30.0, "bob": 30.0, "carol": 10.0, "dave": 0.0}, ["erin"])
    # Weights 2 (nlp), 1 (vision), 1 (the users in no team, by default): nlp has half the
    # shares for 6/7 of the usage (0.58), vision a quarter for 1/7 (1.75); no team has used
    # nothing: first.
    teams = [lv.name for lv in tree.levels if lv.level == "team"]
    assert teams == [NO_TEAM, "@lab/vision", "@lab/nlp"]
    assert "@lab/stewards" not in teams  # weights listed: only those teams share
    users = sorted(tree.rank, key=tree.rank_of)
    assert users == ["dave", "erin", "carol", "bob", "alice"]  # bob's weight 3 puts him before alice
    nlp = next(lv for lv in tree.levels if lv.name == "@lab/nlp")
    assert (nlp.weight, round(nlp.share, 3), nlp.usage, round(nlp.usage_share, 3)) == (2.0, 0.5, 60.0, 0.857)
    assert math.isinf(next(lv for lv in tree.levels if lv.name == "dave").fair_share)


def test_without_weights_every_team_counts_once_and_a_member_of_two_counts_in_the_first_by_name():
    p = policy(TEAMS.replace("[carol]", "[carol, alice]"))
    tree = fair_tree(p, {"alice": 1.0, "carol": 1.0})
    assert tree.team == {"alice": "@lab/nlp", "carol": "@lab/vision"}


def test_weight_zero_goes_last_but_still_ranks():
    p = policy(TEAMS + 'fair_share:\n  teams: {"@lab/nlp": 0, "@lab/vision": 1}\n')
    tree = fair_tree(p, {"carol": 100.0}, ["alice"])
    assert sorted(tree.rank, key=tree.rank_of) == ["carol", "alice"]


LAB = TEAMS + """\
quotas:
  lab: {chips: {v4: 16}}
fair_share:
  half_life_hours: 12
  teams: {"@lab/nlp": WN, "@lab/vision": WV}
"""


def busy_lab(nlp: int, vision: int, hours: int) -> dict[str, float]:
    """Both teams keep more 4-chip jobs waiting than the lab's 16 chips hold; each job runs an
    hour. Chip-hours each team got."""
    templates = [(o, "v4-8", 500, "ondemand", 0) for o in ("alice", "bob", "carol") for _ in range(4)]
    world = World(policy(LAB.replace("WN", str(nlp)).replace("WV", str(vision))), templates)
    got = {"@lab/nlp": 0.0, "@lab/vision": 0.0}
    for _ in range(hours):
        for i in range(len(templates)):
            world.step("finish", i)
            world.step("submit", i)
        world.one_pass()  # the ended jobs give their TPUs back
        world.one_pass()  # the freed chips go to the waiting jobs, by the tree
        for job in world.jobs.values():
            if job.state == "running":
                got["@lab/vision" if job.owner == "carol" else "@lab/nlp"] += 4
        world.step("tick", 1.0)
    return got


def test_a_full_lab_is_shared_by_the_teams_weights():
    got = busy_lab(3, 1, 96)
    assert 2.4 < got["@lab/nlp"] / got["@lab/vision"] < 3.8, got
    even = busy_lab(1, 1, 96)
    assert 0.75 < even["@lab/nlp"] / even["@lab/vision"] < 1.33, even


def test_no_team_with_a_weight_starves_and_weight_zero_takes_only_what_is_left():
    got = busy_lab(50, 1, 72)
    assert got["@lab/vision"] > 0, got  # a hundredth of the weight, yet it runs
    assert busy_lab(1, 0, 24)["@lab/vision"] == 0  # nothing is left for weight 0 while nlp waits


def test_the_documented_example_policy_is_valid_and_is_the_one_shown():
    root = Path(__file__).resolve().parents[2]
    example = root / "docs" / "examples" / "sharing-policy.yaml"
    p = load_policy(example)
    assert p.quotas.borrowing and p.quotas.on_spent == "checkpoint-and-stop" and p.fair_share.users == {"alice": 2.0}
    body = "\n".join(line for line in example.read_text().splitlines() if not line.startswith("#")).strip()
    assert body in (root / "docs" / "sharing.md").read_text()
