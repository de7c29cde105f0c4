"""The watcher records the policy in force: a `policy_changed` event (on `_policy`, with the
parsed price table) for each ingested commit that changes .ledger/policy.yaml, and none for a
change the policy's own approval rules refused."""

from __future__ import annotations

from gitops_helpers import ALICE, BOB, MALLORY, POLICY

from ledger.gitops import ingest
from ledger.spec.policy import sharing_policy
from ledger.usage import POLICY_STREAM

PRICED = POLICY + "prices:\n  v4: {spot: 1.25, ondemand: 3.5}\n"


def policy_events(store):
    return [e for e in store.read_all() if e.stream == POLICY_STREAM]


def test_each_approved_policy_change_records_its_price_table_once(hub, store):
    first = hub.bootstrap()
    ingest(hub.bare, store, "main")
    [boot] = policy_events(store)
    assert boot.type == "policy_changed" and boot.data["commit"] == first and boot.data["prices"] == []
    priced = hub.commit({".ledger/policy.yaml": PRICED}, "Prices from the lab's contract", author=ALICE, approvers=(BOB,))
    refused = hub.commit({".ledger/policy.yaml": POLICY + "prices:\n  v4: {spot: 0.01}\n"}, "cheaper", author=MALLORY)
    hub.push()
    report = ingest(hub.bare, store, "main")
    assert report.counts.get("policy_changed") == 1 and report.counts.get("rejected") == 1
    events = policy_events(store)
    assert [e.data["commit"] for e in events] == [first, priced]  # the refused change is no policy in force
    assert events[1].data["prices"] == [
        {"family": "v4", "pricing": "ondemand", "usd_per_chip_hour": 3.5},
        {"family": "v4", "pricing": "spot", "usd_per_chip_hour": 1.25}]
    assert refused != priced
    ingest(hub.bare, store, "main")  # again: nothing new
    assert len(policy_events(store)) == 2


def test_a_broken_prices_block_records_no_prices_and_says_so(hub, store):
    hub.bootstrap()
    hub.commit({".ledger/policy.yaml": POLICY + "prices:\n  v4: {spot: -1}\n"}, "typo", author=ALICE, approvers=(BOB,))
    hub.push()
    ingest(hub.bare, store, "main")
    last = policy_events(store)[-1]
    assert last.data["prices"] == [] and last.data["broken"] is True


def test_the_sharing_rules_of_an_approved_policy_are_recorded_and_are_the_ones_in_force(hub, store):
    hub.bootstrap()
    hub.commit({".ledger/policy.yaml": POLICY + "quotas:\n  users:\n    alice: {chips: {v4: 64}}\n"
                "priorities:\n  classes: {low: 100, urgent: 900}\n  preempt: {urgent: [low]}\n"},
               "alice's quota", author=ALICE, approvers=(BOB,))
    hub.push()
    ingest(hub.bare, store, "main")
    last = policy_events(store)[-1]
    in_force = sharing_policy(last.data["sharing"])
    assert in_force.quotas.users["alice"].chips == {"v4": 64}
    assert in_force.priorities.preempt == {"urgent": frozenset({"low"})}
    assert "notify" not in last.data["sharing"] and "approval" not in last.data["sharing"]
