"""GitHub's web-flow signatures as approval evidence: a merge GitHub made and signed counts
when the policy accepts web-flow; a commit typed in GitHub's web editor does not approve by
its trailers; other OpenPGP keys, and the shipped key set, are what they are."""

from __future__ import annotations

import pytest
from gitops_helpers import ALICE, BOB, CODEOWNERS, Hub, git, spec
from webflow_double import WebFlowDouble

from ledger.forge.webflow import SHIPPED_TRUSTED, WebFlowKeys, verdict
from ledger.gitops import ingest

SIGNED = ("approval:\n  mode: {mode}\n  required: 1\n  approvers: codeowners\n  signatures: required\n"
          "  web_flow: {web_flow}\n")


@pytest.fixture
def double(tmp_path):
    d = WebFlowDouble(tmp_path)
    yield d
    d.close()


def merged_pr(hub: Hub, double: WebFlowDouble, job: str, number: int) -> str:
    git(hub.work, "checkout", "-q", "-b", f"pr{number}")
    hub.commit({job: spec()}, f"Add {job}", author=ALICE)
    git(hub.work, "checkout", "-q", "main")
    double.git(hub.work, "merge", "-q", "--no-ff", "-S", f"pr{number}", "-m",
               f"Merge pull request #{number} from alice/pr{number}", author=BOB)
    hub.push()
    return hub.head()


def setup(hub: Hub, mode: str = "merge-commit", web_flow: str = "accepted") -> None:
    hub.commit({".ledger/policy.yaml": SIGNED.format(mode=mode, web_flow=web_flow), "CODEOWNERS": CODEOWNERS},
               "Set up")
    hub.push("-u")


def test_a_merge_github_signed_counts_when_the_policy_accepts_web_flow(hub, store, double):
    setup(hub)
    sha = merged_pr(hub, double, "jobs/alice/a.yaml", 5)
    ingest(hub.bare, store, "main", web_flow=WebFlowKeys.from_file(double.public))
    [ev] = store.read_stream("alice/a")
    assert ev.type == "submitted" and ev.data["commit"] == sha
    assert ev.data["signed_by"] == "GitHub web-flow" and ev.data["pr"] == 5


def test_web_flow_is_refused_unless_accepted_and_another_key_is_untrusted(hub, store, double, tmp_path):
    setup(hub, web_flow="off")
    merged_pr(hub, double, "jobs/alice/a.yaml", 5)
    ingest(hub.bare, store, "main", web_flow=WebFlowKeys.from_file(double.public))
    [ev] = store.read_stream("alice/a")
    assert ev.type == "rejected" and "approval.web_flow is not `accepted`" in ev.data["reason"]
    # the shipped keys (GitHub's) do not know the double's key
    merged_pr(hub, double, "jobs/alice/b.yaml", 6)
    ingest(hub.bare, store, "main")
    [ev] = store.read_stream("alice/b")
    assert ev.type == "rejected" and "not a trusted web-flow key" in ev.data["reason"]


def test_trailers_on_a_commit_github_signed_do_not_approve(hub, store, double):
    """GitHub also signs what someone types in its web editor: the signature vouches for
    GitHub's merges, never for a trailer."""
    setup(hub, mode="either")
    hub.write({"jobs/alice/w.yaml": spec()})
    double.git(hub.work, "commit", "-q", "-S", "-m", "Add w\n\nApproved-by: Bob Li <bob@lab.org>", author=ALICE)
    hub.push()
    ingest(hub.bare, store, "main", web_flow=WebFlowKeys.from_file(double.public))
    [ev] = store.read_stream("alice/w")
    assert ev.type == "rejected" and "merged pull request" in ev.data["reason"]


def test_the_shipped_keys_are_githubs_and_status_lines_are_read_strictly():
    keys = WebFlowKeys.shipped()
    assert set(SHIPPED_TRUSTED) < set(keys.fingerprints())  # the expired 2017 key is in the file, not trusted
    assert keys.trusted == {"968479A1AFF927E37D1A566BB5690EEEBB952194"}
    fpr = "968479A1AFF927E37D1A566BB5690EEEBB952194"
    valid = f"[GNUPG:] GOODSIG B5690EEEBB952194 GitHub\n[GNUPG:] VALIDSIG {fpr} 2024-02-01 1 0 4 0 1 10 00 {fpr}\n"
    assert verdict(valid, keys.trusted).status == "good"
    assert verdict(valid.replace("GOODSIG", "EXPKEYSIG"), keys.trusted).status == "untrusted"
    assert verdict("[GNUPG:] BADSIG B5690EEEBB952194 GitHub\n", keys.trusted).status == "bad"
    assert verdict("[GNUPG:] ERRSIG 1234 1 10 00 1 9\n[GNUPG:] NO_PUBKEY 1234\n", keys.trusted).status == "untrusted"
    assert verdict("", keys.trusted).status == "none"
