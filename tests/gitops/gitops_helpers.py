"""Helpers for the watcher's tests: a bare hub, a clone, real `git push` (a unique module name,
so it never collides with another test directory's helpers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ledger.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]

ALICE = ("Alice Ng", "alice@lab.org")
BOB = ("Bob Li", "bob@lab.org")
CAROL = ("Carol Ruiz", "carol@lab.org")
MALLORY = ("Mallory", "mallory@lab.org")

POLICY = "approval:\n  mode: trailers\n  required: 1\n  approvers: codeowners\n"
CODEOWNERS = (
    "# who approves which jobs\n"
    "* @alice\n"
    "/jobs/alice/ @bob carol@lab.org\n"
    "/jobs/bob/ @alice\n"
    "/jobs/mallory/ @alice\n"
    "/.ledger/ @alice @bob\n"
    "/CODEOWNERS @alice @bob\n"
)


def spec(accelerator: str = "v4-8", run: str = "python train.py") -> str:
    return (
        "tpu:\n"
        f"  accelerator: {accelerator}\n"
        "  zone: us-central2-b\n"
        "command:\n"
        f"  run: {run}\n"
    )


def git_env(author: tuple[str, str] = ALICE, home: Path | None = None,
            committer: tuple[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ}
    for k in list(env):
        if k.startswith("GIT_"):
            del env[k]
    committer = committer or author
    env.update({
        "GIT_AUTHOR_NAME": author[0], "GIT_AUTHOR_EMAIL": author[1],
        "GIT_COMMITTER_NAME": committer[0], "GIT_COMMITTER_EMAIL": committer[1],
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
    })
    return env


def git(cwd: Path, *args: str, author: tuple[str, str] = ALICE, input: bytes | None = None,
        committer: tuple[str, str] | None = None) -> str:
    proc = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, env=git_env(author, committer=committer),
                          input=input)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr.decode()}")
    return proc.stdout.decode()


def trailer(*who: tuple[str, str]) -> str:
    return "\n".join(f"Approved-by: {n} <{e}>" for n, e in who)


class Hub:
    """A bare hub and a working clone that pushes to it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bare = root / "hub.git"
        self.work = root / "work"
        git(root, "init", "-q", "--bare", "-b", "main", str(self.bare))
        git(root, "clone", "-q", str(self.bare), str(self.work))
        git(self.work, "checkout", "-q", "-b", "main")

    def write(self, files: dict[str, str | None]) -> None:
        for rel, text in files.items():
            path = self.work / rel
            if text is None:
                git(self.work, "rm", "-q", rel)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                git(self.work, "add", rel)

    def commit(self, files: dict[str, str | None], message: str, author: tuple[str, str] = ALICE,
               approvers: tuple[tuple[str, str], ...] = ()) -> str:
        self.write(files)
        body = message + (f"\n\n{trailer(*approvers)}" if approvers else "")
        git(self.work, "commit", "-q", "--allow-empty", "-m", body, author=author)
        return self.head()

    def head(self, ref: str = "HEAD") -> str:
        return git(self.work, "rev-parse", ref).strip()

    def push(self, *extra: str) -> None:
        git(self.work, "push", "-q", *extra, "origin", "main")

    def bootstrap(self) -> str:
        sha = self.commit({".ledger/policy.yaml": POLICY, "CODEOWNERS": CODEOWNERS, "README.md": "jobs\n"},
                          "Set up the jobs repository")
        self.push("-u")
        return sha

    def fast_commits(self, n: int, *, owner: str = "bulk", approver: tuple[str, str] = ALICE,
                     author: tuple[str, str] | None = None) -> list[str]:
        """n commits, each adding one approved job, via git fast-import (seconds, not minutes);
        written by the owner of the jobs (`owner@lab.org`) unless `author` says otherwise."""
        author = author or (owner.title(), f"{owner}@lab.org")
        parent = self.head()
        lines: list[bytes] = []
        for i in range(n):
            text = spec(run=f"python train.py --seed {i}").encode()
            msg = f"Add {owner}/j{i:05d}\n\n{trailer(approver)}\n".encode()
            ts = 1_700_000_000 + i
            lines += [b"commit refs/heads/main\n", f"mark :{i + 1}\n".encode(),
                      f"author {author[0]} <{author[1]}> {ts} +0000\n".encode(),
                      f"committer {author[0]} <{author[1]}> {ts} +0000\n".encode(),
                      f"data {len(msg)}\n".encode(), msg]
            lines.append(f"from {parent}\n".encode() if i == 0 else f"from :{i}\n".encode())
            lines += [f"M 100644 inline jobs/{owner}/j{i:05d}.yaml\n".encode(), f"data {len(text)}\n".encode(), text, b"\n"]
        git(self.work, "fast-import", "--quiet", "--force", input=b"".join(lines))
        git(self.work, "reset", "-q", "--hard", "main")
        out = git(self.work, "rev-list", "--reverse", f"{parent}..main").split()
        return out


def cli_env(store_url: str) -> dict[str, str]:
    env = git_env()
    env["LEDGER_STORE"] = store_url
    env["COLUMNS"] = "240"  # rich wraps tables to the terminal; tests read whole cells
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_cli(store_url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "ledger", *args], cwd=ROOT, env=cli_env(store_url),
                          capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"ledger {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def wait_for(predicate: Callable[[], object], timeout: float = 30.0, step: float = 0.02) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)


def job_events(store: SQLiteStore) -> list:
    return [e for e in store.read_all() if not e.stream.startswith("_")]
