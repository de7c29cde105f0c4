"""The approval matrix against real git: each way a change can reach the protected branch,
and the exact event (and reason) the watcher records for it.

Real repositories and pushes, real `ssh-keygen -t ed25519` keys, real `git commit -S`
signatures checked by the project's SSHSIG verifier (ledger.gitops.signed) against the
repository's own allowed-signers file (the payload it checks, by the real `ssh-keygen` too).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from gitops_helpers import ALICE, BOB, CAROL, MALLORY, POLICY, Hub, git, spec

from ledger.gitops import ingest
from ledger.gitops.repo import GitRepo
from ledger.gitops.signed import committed_at, is_ssh, split_signed, ssh_verdict

SAM = ("Sam Steward", "sam@lab.example")
JOB = "jobs/alice/a.yaml"


def who(person: tuple[str, str]) -> str:
    return f"{person[0]} <{person[1]}>"


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    """An ed25519 key for the steward (listed in allowed_signers), one for mallory (not)."""
    root = tmp_path_factory.mktemp("keys")
    out = {}
    for name in ("sam", "mallory", "alice"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(root / name)], check=True)
        out[name] = root / name
    return out


def fingerprint(key: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", f"{key}.pub"], capture_output=True, text=True,
                          check=True).stdout.split()[1]


def allowed_signers(keys: dict[str, Path], *names: str) -> str:
    emails = {"sam": SAM[1], "alice": ALICE[1], "mallory": MALLORY[1]}
    return "".join(f'{emails[n]} namespaces="git" {keys[n].with_suffix(".pub").read_text().strip()}\n' for n in names)


def signed(key: Path) -> tuple[str, ...]:
    """git options that sign with `key` (SSH signatures, as `git commit -S` makes them)."""
    return ("-c", "gpg.format=ssh", "-c", f"user.signingkey={key}")


def pull_request(hub: Hub, files: dict[str, str], commits: list[tuple[str, tuple[str, str]]] | None = None,
                 branch: str = "feature") -> None:
    """A branch whose commits (message, author) each write `files` (a changed line each)."""
    git(hub.work, "checkout", "-q", "-b", branch)
    for i, (message, author) in enumerate(commits or [("job in a PR", ALICE)]):
        hub.commit({p: text + f"# {i}\n" for p, text in files.items()}, message, author=author)
    git(hub.work, "checkout", "-q", "main")


TEAM_POLICY = POLICY + "teams:\n  lab/stewards: [Carol Ruiz, '@carol']\n"
TEAM_OWNERS = "* @alice\n/jobs/ @lab/stewards\n"
MERGE_POLICY = "approval:\n  mode: merge-commit\n"
SIGNED_POLICY = "approval:\n  mode: merge-commit\n  signatures: required\n"


def owner_approves(hub: Hub, keys) -> None:
    hub.commit({JOB: spec()}, "Add alice/a", approvers=(BOB,))


def author_self_approves(hub: Hub, keys) -> None:
    hub.commit({JOB: spec()}, "Add alice/a for alice", author=BOB, approvers=(BOB,))


def team_member(hub: Hub, keys) -> None:
    hub.commit({".ledger/policy.yaml": TEAM_POLICY, "CODEOWNERS": TEAM_OWNERS}, "stewards", approvers=(BOB,))
    hub.commit({JOB: spec()}, "Add alice/a", approvers=(CAROL,))


def non_member(hub: Hub, keys) -> None:
    hub.commit({".ledger/policy.yaml": TEAM_POLICY, "CODEOWNERS": TEAM_OWNERS}, "stewards", approvers=(BOB,))
    hub.commit({JOB: spec()}, "Add alice/a", approvers=(MALLORY,))


def trailer_with_continuation_line(hub: Hub, keys) -> None:
    # git folds the value's second line into it; the old hand-written parser refused the block
    git(hub.work, "add", "-A")
    (hub.work / "jobs/alice").mkdir(parents=True)
    (hub.work / JOB).write_text(spec())
    git(hub.work, "add", JOB)
    git(hub.work, "commit", "-q", "-m", "Add alice/a\n\nApproved-by: Bob Li\n  <bob@lab.org>\nSigned-off-by: Alice Ng <alice@lab.org>")


def codeowners_in_dot_github(hub: Hub, keys) -> None:
    # GitHub reads .github/CODEOWNERS first: once it exists, the root file's @mallory owns nothing
    hub.commit({"CODEOWNERS": "* @mallory\n"}, "mallory owns everything", approvers=(BOB,))
    hub.commit({".github/CODEOWNERS": "/jobs/alice/ @carol\n"}, "owners where GitHub looks", author=CAROL,
               approvers=(MALLORY,))
    hub.commit({JOB: spec()}, "Add alice/a", approvers=(MALLORY,))


def merged_pull_request_by_two_authors(hub: Hub, keys) -> None:
    hub.commit({".ledger/policy.yaml": MERGE_POLICY}, "trust the host", approvers=(BOB,))
    pull_request(hub, {JOB: spec()}, [("first draft", ALICE), ("bigger batch", CAROL)])
    git(hub.work, "merge", "-q", "--no-ff", "feature", "-m", "Merge pull request #7 from alice/feature", author=SAM)


def squash_merge(hub: Hub, keys) -> None:
    # the host squashes: the PR's author stays the author, the merger is the committer
    hub.commit({".ledger/policy.yaml": MERGE_POLICY}, "trust the host", approvers=(BOB,))
    hub.write({JOB: spec()})
    git(hub.work, "commit", "-q", "-m", "Add alice/a (#12)", author=ALICE, committer=SAM)


def gitlab_merge(hub: Hub, keys) -> None:
    hub.commit({".ledger/policy.yaml": MERGE_POLICY}, "trust the host", approvers=(BOB,))
    pull_request(hub, {JOB: spec()})
    git(hub.work, "merge", "-q", "--no-ff", "feature", "-m",
        "Merge branch 'feature' into 'main'\n\nAdd alice/a\n\nSee merge request lab/jobs!5", author=SAM)


def _signing_setup(hub: Hub, keys) -> None:
    hub.commit({".ledger/policy.yaml": SIGNED_POLICY, ".ledger/allowed_signers": allowed_signers(keys, "sam", "alice")},
               "signed merges only", approvers=(BOB,))


def _merge_pull_request_1(hub: Hub, keys, merger: tuple[str, str], key: str | None) -> None:
    """Signed merges only; alice's pull request merged by `merger`, signed with `key` (None: unsigned)."""
    _signing_setup(hub, keys)
    pull_request(hub, {JOB: spec()})
    signing = (*signed(keys[key]), "merge", "-S") if key else ("merge",)
    git(hub.work, *signing, "-q", "--no-ff", "feature", "-m", "Merge pull request #1 from alice/feature",
        author=merger)


def forged_merge_message(hub: Hub, keys) -> None:
    _merge_pull_request_1(hub, keys, MALLORY, None)


def merge_signed_by_an_unlisted_key(hub: Hub, keys) -> None:
    _merge_pull_request_1(hub, keys, MALLORY, "mallory")


def merge_signed_by_its_author(hub: Hub, keys) -> None:
    _merge_pull_request_1(hub, keys, ALICE, "alice")


def merge_signed_by_a_steward(hub: Hub, keys) -> None:
    _merge_pull_request_1(hub, keys, SAM, "sam")


def change_of_allowed_signers_is_judged_by_the_old_file(hub: Hub, keys) -> None:
    # mallory adds her own key and signs with it, in one commit: the old file does not list her
    _signing_setup(hub, keys)
    hub.write({".ledger/allowed_signers": allowed_signers(keys, "sam", "alice", "mallory"), JOB: spec()})
    git(hub.work, *signed(keys["mallory"]), "commit", "-q", "-S", "-m", "Add alice/a (#2)", author=MALLORY)


NOT_SIGNED = "not approved: the commit is not signed, and approval.signatures is required"
UNLISTED = "not approved: the commit is signed by key {mallory}, which .ledger/allowed_signers does not list"

# (scenario, event type, exact data fields expected of the job's one event)
CASES: list[tuple[Callable, str, dict]] = [
    (owner_approves, "submitted", {"author": ALICE[1], "approvers": [who(BOB)]}),
    (author_self_approves, "rejected",
     {"author": BOB[1], "reason": "not approved: needs 1 more approval(s) from carol@lab.org",
      "would_approve": ["carol@lab.org"]}),
    (team_member, "submitted", {"author": ALICE[1], "approvers": [who(CAROL)]}),
    (non_member, "rejected", {"reason": "not approved: needs 1 more approval(s) from Carol Ruiz, @carol",
                              "would_approve": ["Carol Ruiz", "@carol"]}),
    (trailer_with_continuation_line, "submitted", {"author": ALICE[1], "approvers": [who(BOB)]}),
    (codeowners_in_dot_github, "rejected", {"reason": "not approved: needs 1 more approval(s) from @carol"}),
    (merged_pull_request_by_two_authors, "submitted",
     {"author": ALICE[1], "authors": [who(ALICE), who(CAROL)], "merger": who(SAM), "approvers": [who(SAM)], "pr": 7}),
    (squash_merge, "submitted", {"author": ALICE[1], "merger": who(SAM), "approvers": [who(SAM)], "pr": 12}),
    (gitlab_merge, "submitted", {"author": ALICE[1], "merger": who(SAM), "pr": 5}),
    (forged_merge_message, "rejected", {"reason": NOT_SIGNED}),
    (merge_signed_by_an_unlisted_key, "rejected", {"reason": UNLISTED}),
    (merge_signed_by_its_author, "rejected", {"reason": "not approved: the commit is signed by alice@lab.org, an "
                                              "author of the change: an author cannot approve it"}),
    (merge_signed_by_a_steward, "submitted",
     {"author": ALICE[1], "merger": who(SAM), "signed_by": SAM[1], "approvers": [who(SAM)], "pr": 1}),
    (change_of_allowed_signers_is_judged_by_the_old_file, "rejected", {"reason": UNLISTED}),
]


@pytest.mark.parametrize(("scenario", "type_", "expected"), CASES, ids=[c[0].__name__ for c in CASES])
def test_approval_matrix(hub, store, keys, scenario, type_, expected):
    hub.bootstrap()
    scenario(hub, keys)
    hub.push()
    ingest(hub.bare, store, "main")
    [event] = store.read_stream("alice/a")
    want = {k: v.format(mallory=fingerprint(keys["mallory"])) if isinstance(v, str) else v for k, v in expected.items()}
    assert (event.type, {k: event.data.get(k) for k in want}) == (type_, want)
    if type_ == "submitted":  # the actor is who asked, with who approved and merged beside
        assert (event.actor["kind"], event.actor["email"], event.actor.get("merger")) == (
            "git", expected["author"], expected.get("merger"))


def test_a_commit_signature_is_checked_by_our_sshsig_verifier_on_the_payload_ssh_keygen_accepts(hub: Hub, keys, tmp_path):
    hub.commit({"README.md": "unsigned\n"}, "an unsigned commit")
    hub.write({JOB: spec()})
    git(hub.work, *signed(keys["sam"]), "commit", "-q", "-S", "-m", "Add alice/a\n\nwith a body", author=SAM)
    sha = git(hub.work, "rev-parse", "HEAD").strip()
    raw = GitRepo(hub.work).commit_object(sha)
    payload, armored = split_signed(raw)
    assert armored is not None and is_ssh(armored) and b"gpgsig" not in payload and payload.endswith(b"with a body\n")
    # the real ssh-keygen agrees that this is what git signed
    (tmp_path / "allowed").write_text(allowed_signers(keys, "sam"))
    (tmp_path / "sig").write_text(armored + "\n")
    subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(tmp_path / "allowed"), "-I", SAM[1], "-n", "git",
                    "-s", str(tmp_path / "sig")], input=payload, check=True, capture_output=True)
    at = committed_at(raw)
    good = ssh_verdict(payload, armored, allowed_signers(keys, "sam"), at)
    assert (good.status, good.principal, good.key) == ("good", SAM[1], fingerprint(keys["sam"]))
    assert ssh_verdict(payload.replace(b"with a body", b"with a bod!"), armored, allowed_signers(keys, "sam"), at).status == "bad"
    assert ssh_verdict(payload, armored, allowed_signers(keys, "alice"), at).status == "untrusted"
    retired = allowed_signers(keys, "sam").replace('namespaces="git"', 'namespaces="git",valid-before="20000101"')
    assert ssh_verdict(payload, armored, retired, at).status == "untrusted"  # judged at the commit's time
    unsigned = GitRepo(hub.work).commit_object(git(hub.work, "rev-parse", "HEAD~1").strip())
    assert split_signed(unsigned) == (unsigned, None)
