"""The git adapter (GitPython's `git.Repo`) against real repositories: refs loose and packed,
blobs one by one and in a batch, a dead `cat-file`, an environment that points elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from gitops_helpers import BOB, git, spec

from ledger.gitops.mirror import ensure_mirror
from ledger.gitops.repo import PERSISTENT_READS, ZERO, GitError, GitRepo


def test_branch_head_reads_loose_and_packed_refs(hub):
    hub.bootstrap()
    sha = hub.commit({"jobs/alice/a.yaml": spec()}, "a", approvers=(BOB,))
    hub.push()
    with GitRepo(hub.bare) as repo:
        assert repo.branch_head("main") == sha == repo.resolve("main")
        git(hub.bare, "pack-refs", "--all", "--prune")
        assert not (hub.bare / "refs/heads/main").exists()
        assert repo.branch_head("main") == sha
        assert repo.branch_head("nope") is None and repo.resolve("nope") is None
        assert repo.branch_head("../../config") is None  # never a path outside refs/


def test_blobs_one_by_one_and_in_a_batch_agree(hub):
    hub.bootstrap()
    commits = hub.fast_commits(PERSISTENT_READS + 8)
    with GitRepo(hub.work) as repo:
        changes = repo.diffs([(c, None) for c in commits[:1]] + list(zip(commits[1:], commits, strict=False)))
        blobs = [ch.new_blob for c in commits for ch in changes[c]]
        assert len(blobs) == len(commits)
        missing = "1" * 40
        few = repo.read_blobs([*blobs[:3], missing, ZERO, blobs[0]])  # the persistent cat-file
        many = repo.read_blobs([*blobs, missing])  # one batch process
        assert set(few) == set(blobs[:3]) and set(many) == set(blobs)
        assert all(many[b] == few[b] for b in few)
        assert b"--seed 0" in many[blobs[0]]


def test_a_dead_cat_file_is_an_error_never_an_empty_file(hub):
    sha = hub.bootstrap()
    with GitRepo(hub.work) as repo:
        blob = repo.blob_ids(sha, [".ledger/policy.yaml"])[".ledger/policy.yaml"]
        assert repo.read_blobs([blob])[blob].startswith(b"approval:")
        repo.repo.git.cat_file_all.proc.kill()  # GitPython's persistent `cat-file --batch`
        repo.repo.git.cat_file_all.proc.wait()
        with pytest.raises(GitError, match="cat-file"):
            repo.read_blobs([blob])
        assert repo.read_blobs([blob])[blob].startswith(b"approval:")  # a new process serves again


def test_the_callers_git_dir_does_not_leak_in(hub, tmp_path, monkeypatch):
    """A hook runs with GIT_DIR set for the hub; the adapter works on the repository it was given."""
    sha = hub.bootstrap()
    other = tmp_path / "other.git"
    git(tmp_path, "init", "-q", "--bare", str(other))
    monkeypatch.setenv("GIT_DIR", str(other))
    with GitRepo(hub.work) as repo:
        assert repo.git_dir == (hub.work / ".git").resolve()
        assert [c.sha for c in repo.first_parent_range(None, sha)] == [sha]


def test_not_a_repository_and_unsafe_urls_are_one_line_errors(hub, tmp_path: Path):
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(GitError, match="is not a git repository"):
        GitRepo(plain)
    with pytest.raises(GitError, match="refusing to clone"):
        ensure_mirror("ext::sh -c touch% /tmp/pwned", tmp_path / "cache")
    with pytest.raises(GitError, match="git clone failed") as err:
        ensure_mirror((tmp_path / "absent.git").as_uri(), tmp_path / "cache")
    assert err.value.hint and "\n" not in str(err.value)
