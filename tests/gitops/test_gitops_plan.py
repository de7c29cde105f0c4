"""`ledger plan REF`: what a PR branch would do, as a CI check."""

from __future__ import annotations

import json

from gitops_helpers import ALICE, BOB, CAROL, git, run_cli, spec

from ledger.events import NewEvent, actor
from ledger.gitops import ingest, plan

ALIASES = "tpus:\n  pool-a:\n    name: lab-v4-32-a\n    zone: us-central2-b\n    accelerator: v4-32\n"


def test_plan_lists_submit_update_cancel_invalid_and_held_shared_tpus(hub, store, store_url):
    hub.bootstrap()
    hub.commit({".ledger/aliases.yaml": ALIASES, "jobs/alice/old.yaml": spec(), "jobs/alice/keep.yaml": spec(),
                "jobs/bob/pool.yaml": "tpu: pool-a\ncommand:\n  run: python a.py\n"}, "base", author=CAROL,
               approvers=(BOB, ALICE))
    hub.push()
    ingest(hub.bare, store, "main")  # bob/pool now holds the shared TPU pool-a
    git(hub.work, "checkout", "-q", "-b", "pr")
    hub.commit({
        "jobs/alice/new.yaml": "tpu: pool-a\ncommand:\n  run: python b.py\n",
        "jobs/alice/keep.yaml": spec("v4-32"),
        "jobs/alice/old.yaml": None,
        "jobs/alice/broken.yaml": "tpu:\n  accelerator: v4-7\ncommand:\n  run: x\n",
    }, "a PR")
    report = plan(hub.work, "pr", "main", store=store)
    items = {i.path: i for i in report.items}
    assert items["jobs/alice/new.yaml"].action == "submit"
    assert items["jobs/alice/new.yaml"].shared and items["jobs/alice/new.yaml"].held_by == ["bob/pool"]
    assert items["jobs/alice/keep.yaml"].action == "update" and items["jobs/alice/keep.yaml"].chips == 16
    assert items["jobs/alice/old.yaml"].action == "cancel"
    broken = items["jobs/alice/broken.yaml"]
    assert broken.action == "invalid" and broken.errors[0]["line"] == 2
    assert items["jobs/alice/keep.yaml"].approvers == ["@bob", "carol@lab.org"]
    assert not report.ok and report.totals()["invalid"] == 1
    # the CLI: JSON for CI, exit 1 when something would be rejected
    proc = run_cli(store_url, "plan", "pr", "--repo", str(hub.work), "--json", check=False)
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["totals"] == report.totals()
    # fixed: exit 0 and a readable table
    hub.commit({"jobs/alice/broken.yaml": spec()}, "fix")
    proc = run_cli(store_url, "plan", "pr", "--repo", str(hub.work))
    assert "submit" in proc.stdout and "lab-v4-32-a" in proc.stdout and "held by bob/pool" in proc.stdout


def test_plan_as_a_pull_request_comment_names_who_may_still_approve(hub, store_url):
    hub.bootstrap()
    hub.commit({".ledger/policy.yaml": "teams:\n  lab/stewards: [carol@lab.org, bob@lab.org]\n",
                "CODEOWNERS": "* @alice\n/jobs/ @lab/stewards\n"}, "stewards", author=CAROL, approvers=(ALICE,))
    git(hub.work, "checkout", "-q", "-b", "pr")
    hub.commit({"jobs/bob/big.yaml": spec("v4-32"), "jobs/bob/small.yaml": spec("v5litepod-8")}, "bob's jobs",
               author=BOB)
    # bob wrote them: of the stewards, only carol may still approve
    [big, small] = plan(hub.work, "pr", "main").items
    assert (big.owners, big.authors, big.approvers) == (["@lab/stewards"], [f"{BOB[0]} <{BOB[1]}>"], ["carol@lab.org"])
    proc = run_cli(store_url, "plan", "pr", "--repo", str(hub.work), "--format", "markdown")
    lines = proc.stdout.splitlines()
    assert lines[0] == "### ledger plan: `pr` into `main`"
    assert lines[2] == "✅ every spec is valid. Merging submits 2, updates 0 and cancels 0 job(s); 0 invalid."
    [row] = [line for line in lines if line.startswith("| submit | `bob/big` |")]
    assert row.endswith(" (v4-32) | 16 | carol@lab.org | by Bob Li <bob@lab.org> |")
    assert "**Chips requested:** v4: 16, v5litepod: 8 (24 in all)" in lines


def test_plan_says_whether_a_new_job_would_start_now_or_wait_under_the_branch_quotas(hub, store, store_url):
    hub.bootstrap()
    hub.commit({".ledger/policy.yaml": "quotas:\n  users:\n    alice: {chips: {v4: 16}}\n",
                "jobs/alice/big.yaml": spec("v4-32")}, "alice's quota and her job", author=CAROL, approvers=(BOB,))
    hub.push()
    ingest(hub.bare, store, "main")
    big = {"name": "n1", "zone": "us-central2-b", "kind": "node", "accelerator": "v4-32"}
    store.append("alice/big", [NewEvent("provisioning", {"attempt": 1, "tpu": big}, actor("reconciler", "r"))])
    git(hub.work, "checkout", "-q", "-b", "pr")
    hub.commit({"jobs/alice/more.yaml": spec("v4-8"), "jobs/bob/small.yaml": spec("v4-8")}, "two more")
    proc = run_cli(store_url, "plan", "pr", "--repo", str(hub.work), "--json")
    starts = {i["job"]: i["start"] for i in json.loads(proc.stdout)["items"]}
    assert starts["bob/small"] == "would start now"
    assert "over quota: user alice holds 16 of 16 v4 chips, needs 4" in starts["alice/more"]
    assert "would wait" in run_cli(store_url, "plan", "pr", "--repo", str(hub.work), "--format", "markdown").stdout
