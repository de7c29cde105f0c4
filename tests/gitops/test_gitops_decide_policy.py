"""decide() is pure: a commit that changes the policy in force means a `policy_changed`
fact among its events, decided with the rest (no git, no store)."""

from __future__ import annotations

from ledger.gitops.decide import RepoState, StepInput, decide
from ledger.gitops.repo import ZERO, Change, Commit
from ledger.spec.layout import POLICY_PATH
from ledger.usage.prices import POLICY_STREAM

POLICY = b"prices:\n  v4: {spot: 1.5}\n"


def step(sha: str, changes: list[Change], blobs: dict[str, bytes]) -> StepInput:
    commit = Commit(sha, ("p" * 40,), "Ann", "ann@example.com", 1_700_000_000, "policy", "Ann", "ann@example.com")
    return StepInput(commit, "p" * 40, changes, blobs, {}, "main")


def never(*_args):
    raise AssertionError("no job file in these commits")


def test_a_commit_that_changes_the_policy_decides_its_policy_changed_fact_and_one_that_does_not_none():
    first = step("a" * 40, [Change("A", POLICY_PATH, None, ZERO, "b1")], {"b1": POLICY})
    events, state, _ = decide(first, RepoState.of({}, {}), never, never, never)
    [(stream, event)] = [(s, e) for s, e in events if e.type == "policy_changed"]
    data = event.data
    assert stream == POLICY_STREAM and data["commit"] == "a" * 40 and data["branch"] == "main" and data["blob"] == "b1"
    assert data["prices"] == [{"family": "v4", "pricing": "spot", "usd_per_chip_hour": 1.5}]
    assert event.actor == {"kind": "watcher", "name": "ledger watch", "branch": "main"}
    unrelated = step("c" * 40, [Change("A", "README.md", None, ZERO, "b2")], {"b2": b"hello"})
    events, _, _ = decide(unrelated, state, never, never, never)
    assert not [e for _, e in events if e.type == "policy_changed"]
