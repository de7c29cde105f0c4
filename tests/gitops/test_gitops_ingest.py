"""Commits on the protected branch -> events, against a real hub, clone and `git push`."""

from __future__ import annotations

from gitops_helpers import ALICE, BOB, CAROL, CODEOWNERS, MALLORY, git, job_events, spec

from ledger.fold import CANCELLING, PENDING, REJECTED, replay
from ledger.gitops import ingest, read_position


def by_stream(store, stream):
    return [(e.type, e.data) for e in store.read_stream(stream)]


def test_happy_path_submits_with_author_and_approvers(hub, store):
    hub.bootstrap()
    sha = hub.commit({"jobs/alice/sweep.yaml": spec()}, "Add alice/sweep", author=ALICE, approvers=(BOB,))
    hub.push()
    report = ingest(hub.bare, store, "main")
    assert report.commits == 2 and report.position == sha
    [(type_, data)] = by_stream(store, "alice/sweep")
    assert type_ == "submitted"
    assert data["commit"] == sha and data["path"] == "jobs/alice/sweep.yaml"
    assert data["author"] == ALICE[1] and data["approvers"] == [f"{BOB[0]} <{BOB[1]}>"]
    assert data["owner"] == "alice" and data["name"] == "sweep"
    assert data["spec"]["tpu"]["accelerator"] == "v4-8" and len(data["spec_hash"]) >= 16
    assert data["blob"] == git(hub.work, "rev-parse", f"{sha}:jobs/alice/sweep.yaml").strip()
    ev = store.read_stream("alice/sweep")[0]
    assert ev.actor["kind"] == "git" and ev.actor["commit"] == sha and ev.causation == f"git:{sha}"
    assert replay(store.read_all()).jobs["alice/sweep"].state == PENDING
    # the position is in the ledger, in the same place as the events
    assert read_position(store, "main").commit == sha
    # nothing new: a second run appends nothing
    head = store.head()
    assert ingest(hub.bare, store, "main").commits == 0 and store.head() == head


def test_invalid_spec_is_rejected_with_file_line_and_never_crashes(hub, store):
    hub.bootstrap()
    hub.commit({"jobs/alice/bad.yaml": "tpu:\n  accelerator: v9-8\ncommand:\n  run: x\n"}, "bad", approvers=(BOB,))
    good = hub.commit({"jobs/alice/good.yaml": spec()}, "good", approvers=(BOB,))
    hub.push()
    report = ingest(hub.bare, store, "main")
    assert report.position == good
    [(type_, data)] = by_stream(store, "alice/bad")
    assert type_ == "rejected" and data["reason"] == "invalid spec"
    err = data["errors"][0]
    assert err["file"] == "jobs/alice/bad.yaml" and err["line"] == 2 and err["message"]
    assert replay(store.read_all()).jobs["alice/bad"].state == REJECTED
    assert by_stream(store, "alice/good")[0][0] == "submitted"
    # fixing the spec later submits it (the job was rejected, so not an update)
    hub.commit({"jobs/alice/bad.yaml": spec()}, "fix", approvers=(CAROL,))
    hub.push()
    ingest(hub.bare, store, "main")
    assert [t for t, _ in by_stream(store, "alice/bad")] == ["rejected", "submitted"]


def test_unapproved_commit_is_rejected_and_names_who_could_approve(hub, store):
    hub.bootstrap()
    hub.commit({"jobs/alice/a.yaml": spec()}, "no review")
    hub.push()
    ingest(hub.bare, store, "main")
    [(type_, data)] = by_stream(store, "alice/a")
    assert type_ == "rejected" and data["reason"].startswith("not approved")
    assert data["would_approve"] == ["@bob", "carol@lab.org"]
    assert replay(store.read_all()).jobs["alice/a"].state == REJECTED


def test_approval_by_the_author_only_does_not_count(hub, store):
    hub.bootstrap()
    # bob owns jobs/alice/ per CODEOWNERS, but he wrote this change: his trailer is void
    hub.commit({"jobs/alice/x.yaml": spec()}, "self-approved", author=BOB, approvers=(BOB,))
    # mallory is no code owner of jobs/alice/
    hub.commit({"jobs/alice/y.yaml": spec()}, "approved by a stranger", author=BOB, approvers=(MALLORY,))
    hub.push()
    ingest(hub.bare, store, "main")
    assert by_stream(store, "alice/x")[0][0] == "rejected"
    assert by_stream(store, "alice/y")[0][0] == "rejected"


def test_delete_is_cancel_and_rename_cancels_old_and_submits_new(hub, store):
    hub.bootstrap()
    hub.commit({"jobs/alice/a.yaml": spec(), "jobs/alice/b.yaml": spec("v4-16")}, "two jobs", approvers=(BOB,))
    hub.push()
    ingest(hub.bare, store, "main")
    hub.commit({"jobs/alice/a.yaml": None}, "drop a", approvers=(CAROL,))
    git(hub.work, "mv", "jobs/alice/b.yaml", "jobs/alice/c.yaml")
    ren = hub.commit({}, "rename b to c", approvers=(BOB,))
    hub.push()
    ingest(hub.bare, store, "main")
    assert [t for t, _ in by_stream(store, "alice/a")] == ["submitted", "cancel_requested"]
    assert by_stream(store, "alice/a")[1][1]["reason"] == "spec deleted"
    assert [t for t, _ in by_stream(store, "alice/b")] == ["submitted", "cancel_requested"]
    [(type_, data)] = by_stream(store, "alice/c")
    assert type_ == "submitted" and data["commit"] == ren and data["spec"]["tpu"]["accelerator"] == "v4-16"
    jobs = replay(store.read_all()).jobs
    assert jobs["alice/a"].state == CANCELLING and jobs["alice/c"].state == PENDING


def test_modified_spec_of_live_job_is_spec_updated(hub, store):
    hub.bootstrap()
    hub.commit({"jobs/bob/t.yaml": spec()}, "add", author=BOB, approvers=(ALICE,))
    hub.commit({"jobs/bob/t.yaml": spec("v4-32")}, "bigger", author=BOB, approvers=(ALICE,))
    hub.push()
    ingest(hub.bare, store, "main")
    types = [t for t, _ in by_stream(store, "bob/t")]
    assert types == ["submitted", "spec_updated"]
    assert replay(store.read_all()).jobs["bob/t"].spec["tpu"]["accelerator"] == "v4-32"


def test_policy_change_needs_approval_under_the_old_rules(hub, store):
    hub.bootstrap()
    # mallory tries to make herself owner of alice's jobs, without approval
    hub.commit({"CODEOWNERS": CODEOWNERS + "/jobs/alice/ @mallory\n"}, "take over", author=MALLORY)
    hub.commit({"jobs/alice/evil.yaml": spec()}, "evil", author=BOB, approvers=(MALLORY,))
    hub.push()
    ingest(hub.bare, store, "main")
    rejected = [d for t, d in by_stream(store, "_git:main") if t == "rejected"]
    assert rejected and rejected[0]["path"] == "CODEOWNERS"
    assert by_stream(store, "alice/evil")[0][0] == "rejected"
    # an approved change of the file takes effect for the commits after it
    hub.commit({"CODEOWNERS": CODEOWNERS + "/jobs/alice/ @mallory @bob\n"}, "mallory joins", author=MALLORY,
               approvers=(ALICE,))
    hub.commit({"jobs/alice/ok.yaml": spec()}, "ok", author=ALICE, approvers=(MALLORY,))
    hub.push()
    ingest(hub.bare, store, "main")
    assert by_stream(store, "alice/ok")[0][0] == "submitted"


def test_merge_commit_mode_records_the_pull_request(hub, store):
    hub.bootstrap()
    hub.commit({".ledger/policy.yaml": "approval:\n  mode: merge-commit\n"}, "trust the host", approvers=(BOB,))
    hub.push()
    git(hub.work, "checkout", "-q", "-b", "feature")
    hub.commit({"jobs/bob/pr.yaml": spec()}, "job in a PR", author=BOB)
    git(hub.work, "checkout", "-q", "main")
    git(hub.work, "merge", "-q", "--no-ff", "feature", "-m", "Merge pull request #42 from bob/feature")
    hub.commit({"jobs/bob/direct.yaml": spec()}, "pushed straight to main", author=BOB)
    hub.push()
    ingest(hub.bare, store, "main")
    [(type_, data)] = by_stream(store, "bob/pr")
    # bob wrote the job in the pull request; alice merged it (and so approved it)
    assert type_ == "submitted" and data["pr"] == 42 and data["author"] == BOB[1]
    assert data["merger"] == f"{ALICE[0]} <{ALICE[1]}>" and data["approvers"] == [data["merger"]]
    assert by_stream(store, "bob/direct")[0][0] == "rejected"


def test_merge_with_trailers_does_not_let_the_pr_author_approve(hub, store):
    hub.bootstrap()
    git(hub.work, "checkout", "-q", "-b", "feature")
    hub.commit({"jobs/alice/m.yaml": spec()}, "alice's job", author=ALICE)
    git(hub.work, "checkout", "-q", "main")
    # carol merges, and the trailer names alice (the PR's author): not an approval
    git(hub.work, "merge", "-q", "--no-ff", "feature", "-m", "Merge feature", "-m",
        "Approved-by: Alice Ng <alice@lab.org>", author=CAROL)
    hub.push()
    ingest(hub.bare, store, "main")
    assert by_stream(store, "alice/m")[0][0] == "rejected"
    git(hub.work, "checkout", "-q", "-b", "feature2")
    hub.commit({"jobs/alice/n.yaml": spec()}, "second", author=ALICE)
    git(hub.work, "checkout", "-q", "main")
    git(hub.work, "merge", "-q", "--no-ff", "feature2", "-m", "Merge feature2", "-m",
        "Approved-by: Bob Li <bob@lab.org>", author=CAROL)
    hub.push()
    ingest(hub.bare, store, "main")
    assert by_stream(store, "alice/n")[0][0] == "submitted"


def test_a_watcher_with_a_stale_position_appends_nothing_twice(hub, store):
    from ledger.gitops.ingest import (
        IngestReport,
        _ingest_commits,
        _Liveness,
        spec_validator,
    )
    from ledger.gitops.position import Position
    from ledger.gitops.repo import GitRepo
    from ledger.spec.model import spec_hash

    hub.bootstrap()
    hub.commit({"jobs/alice/a.yaml": spec()}, "a", approvers=(BOB,))
    hub.push()
    ingest(hub.bare, store, "main")
    before = [e.id for e in store.read_all()]
    # replay the whole range as a watcher that read the position before anything was stored
    repo = GitRepo(hub.bare)
    report = IngestReport("main")
    _ingest_commits(repo, store, "main", Position(), repo.first_parent_range(None, "main"),
                    spec_validator(), spec_hash, _Liveness(store), report)
    assert (report.commits, report.skipped) == (0, 2)
    assert [e.id for e in store.read_all()] == before
    assert len(job_events(store)) == 1


def test_alias_added_with_the_job_and_ignored_examples(hub, store):
    hub.bootstrap()
    aliases = "tpus:\n  pool-a:\n    name: lab-v4-32-a\n    zone: us-central2-b\n    accelerator: v4-32\n"
    policy = "approval:\n  mode: trailers\n  approvers: codeowners\nignore:\n  - jobs/examples/*\n"
    hub.commit({".ledger/policy.yaml": policy}, "examples never run", author=CAROL, approvers=(ALICE,))
    hub.commit({".ledger/aliases.yaml": aliases, "jobs/alice/pool.yaml": "tpu: pool-a\ncommand:\n  run: python a.py\n",
                "jobs/examples/demo.yaml": spec()}, "use the pool", author=CAROL, approvers=(BOB, ALICE))
    hub.commit({"jobs/examples/demo.yaml": None}, "drop the example", author=CAROL, approvers=(ALICE,))
    hub.push()
    ingest(hub.bare, store, "main")
    [(type_, data)] = by_stream(store, "alice/pool")
    assert type_ == "submitted" and data["spec"]["tpu"]["name"] == "lab-v4-32-a" and data["spec"]["tpu"]["shared"]
    assert "examples/demo" not in store.streams()


def test_a_spec_re_added_after_deletion_is_a_new_submission(hub, store):
    hub.bootstrap()
    hub.commit({"jobs/alice/again.yaml": spec()}, "add", approvers=(BOB,))
    hub.commit({"jobs/alice/again.yaml": None}, "drop", approvers=(BOB,))
    hub.push()
    ingest(hub.bare, store, "main")
    hub.commit({"jobs/alice/again.yaml": spec("v4-16")}, "back", approvers=(CAROL,))
    hub.push()
    ingest(hub.bare, store, "main")
    assert [t for t, _ in by_stream(store, "alice/again")] == ["submitted", "cancel_requested", "submitted"]
