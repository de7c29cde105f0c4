"""`ledger validate` and `ledger init` as a user runs them: real processes, real git."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD = "tpu: {accelerator: v4-8, zone: us-central2-b}\ncommand: {cmd: python train.py}\n"
BAD = "tpu: {accelerator: v4-8, zone: us-central2-b}\ncommand: {cmd: python train.py, wrkers: all}\n"


def ledger(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run([sys.executable, "-m", "ledger", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A jobs repository made by `ledger init`, as a user starts."""
    path = tmp_path_factory.mktemp("cli") / "jobs-repo"
    done = ledger("init", str(path), cwd=path.parent)
    assert done.returncode == 0, done.stderr
    return path


def test_init_lays_the_template_and_commits_it(repo):
    files = set(git("ls-files", cwd=repo).split())
    for expected in ("README.md", "CODEOWNERS", ".pre-commit-config.yaml", ".github/workflows/validate.yml",
                     ".ledger/aliases.yaml", ".ledger/policy.yaml", ".ledger/schemas/job.schema.json",
                     "jobs/examples/pod.yaml", "jobs/examples/shared-tpu.yaml"):
        assert expected in files
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=repo).strip() == "main"
    assert git("status", "--porcelain", cwd=repo) == ""
    workflow = (repo / ".github/workflows/validate.yml").read_text()
    assert "ledger validate" in workflow and "ledger plan" in workflow
    # the plan is posted on the pull request, and updated in place at each push
    assert "--format markdown" in workflow and "updateComment" in workflow
    assert "ledger validate" in (repo / ".pre-commit-config.yaml").read_text()


def test_validate_a_fresh_repository_exits_0(repo):
    done = ledger("validate", cwd=repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "9 file(s) checked: ok" in done.stderr


def test_validate_reports_file_line_pointer_and_hint(repo):
    (repo / "jobs" / "alice").mkdir(exist_ok=True)
    (repo / "jobs/alice/bad.yaml").write_text(BAD)
    (repo / "jobs/alice/good.yaml").write_text(GOOD)
    try:
        done = ledger("validate", "jobs/alice", cwd=repo)
        assert done.returncode == 1
        assert "jobs/alice/bad.yaml:2:33: error: unknown field `wrkers` in `command` [/command/wrkers]" in done.stdout
        assert "hint: did you mean `workers`?" in done.stdout
        done = ledger("validate", "--json", "jobs/alice/good.yaml", "jobs/alice/bad.yaml", cwd=repo)
        assert done.returncode == 1
        out = json.loads(done.stdout)
        assert [(r["path"], r["ok"]) for r in out] == [("jobs/alice/good.yaml", True), ("jobs/alice/bad.yaml", False)]
        error = out[1]["errors"][0]
        assert {k: error[k] for k in ("file", "line", "column", "pointer", "severity")} == {
            "file": "jobs/alice/bad.yaml", "line": 2, "column": 33, "pointer": "/command/wrkers", "severity": "error"}
        assert out[0]["job_id"] == "alice/good" and len(out[0]["spec_hash"]) == 64
        assert ledger("validate", "jobs/alice/good.yaml", cwd=repo).returncode == 0
        # From a subdirectory, the repository (and its aliases) is found by walking up.
        assert ledger("validate", "good.yaml", cwd=repo / "jobs/alice").returncode == 0
    finally:
        (repo / "jobs/alice/bad.yaml").unlink()
        (repo / "jobs/alice/good.yaml").unlink()


def test_validate_usage_errors_exit_2(repo):
    done = ledger("validate", "no/such/file.yaml", cwd=repo)
    assert done.returncode == 2 and "no such file or directory" in done.stderr
    assert ledger("validate", "--bogus", cwd=repo).returncode == 2


def test_validate_checks_the_repo_config(tmp_path):
    (tmp_path / ".ledger").mkdir()
    (tmp_path / ".ledger/policy.yaml").write_text("approval:\n  mode: sometimes\n")
    (tmp_path / "jobs/bob").mkdir(parents=True)
    (tmp_path / "jobs/bob/x.yaml").write_text(GOOD)
    done = ledger("validate", "--json", cwd=tmp_path)
    assert done.returncode == 1
    out = json.loads(done.stdout)
    assert out[0]["path"] == ".ledger/policy.yaml" and out[0]["errors"][0]["line"] == 2
    assert out[1]["ok"]


def test_validate_refuses_symlinks(tmp_path):
    (tmp_path / "jobs/bob").mkdir(parents=True)
    (tmp_path / "secret").write_text("password")
    (tmp_path / "jobs/bob/x.yaml").symlink_to(tmp_path / "secret")
    done = ledger("validate", "--json", cwd=tmp_path)
    assert done.returncode == 1
    assert "symbolic links" in json.loads(done.stdout)[0]["errors"][0]["message"]


def test_init_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x/file").write_text("keep me")
    done = ledger("init", "x", cwd=tmp_path)
    assert done.returncode == 2 and "not empty" in done.stderr
    assert (tmp_path / "x/file").read_text() == "keep me"


def test_init_bare_makes_a_hub_with_the_template_on_main(tmp_path):
    done = ledger("init", "--bare", "hub.git", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    hub = tmp_path / "hub.git"
    assert git("rev-parse", "--is-bare-repository", cwd=hub).strip() == "true"
    assert git("symbolic-ref", "HEAD", cwd=hub).strip() == "refs/heads/main"
    assert "jobs/examples/docker.yaml" in git("ls-tree", "-r", "--name-only", "main", cwd=hub).split()
    git("clone", "-q", str(hub), "clone", cwd=tmp_path)
    assert ledger("validate", cwd=tmp_path / "clone").returncode == 0
