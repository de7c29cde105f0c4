"""A thin adapter over the `git` command line: commits, first-parent ranges, tree diffs, blobs.

Everything here is batched so that ingesting a long backlog costs a fixed number of git
processes (one `log`, one `diff-tree --stdin`, one `cat-file --batch`), not one per commit.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import LedgerError
from ledger.spec.layout import CODEOWNERS_PATHS, JOBS_DIR, LEDGER_DIR

ZERO = "0" * 40
# Paths whose changes the watcher looks at: job specs and the files that govern approval.
WATCHED_PATHS = (f"{JOBS_DIR}/", f"{LEDGER_DIR}/", *CODEOWNERS_PATHS)


class GitError(LedgerError):
    pass


@dataclass(frozen=True, slots=True)
class Commit:
    sha: str
    parents: tuple[str, ...]
    author_name: str
    author_email: str
    time: int  # committer time, seconds since the epoch
    message: str

    @property
    def first_parent(self) -> str | None:
        return self.parents[0] if self.parents else None


@dataclass(frozen=True, slots=True)
class Change:
    """One entry of `git diff-tree --raw`: status A/M/D/R/T, blob ids (ZERO when absent)."""

    status: str
    path: str
    old_path: str | None
    old_blob: str
    new_blob: str


_LOG_FORMAT = "%H%x00%P%x00%an%x00%ae%x00%ct%x00%B%x1e"


class GitRepo:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
        self._env.pop("GIT_DIR", None)  # a hook runs with GIT_DIR set for the hub; be explicit
        self._env.pop("GIT_INDEX_FILE", None)
        self.git_dir = Path(self.run("rev-parse", "--absolute-git-dir").strip())

    # -- plumbing -------------------------------------------------------------------------
    def run(self, *args: str, input: bytes | None = None, check: bool = True) -> str:
        return self.run_bytes(*args, input=input, check=check).decode("utf-8", "replace")

    def run_bytes(self, *args: str, input: bytes | None = None, check: bool = True) -> bytes:
        try:
            proc = subprocess.run(
                ["git", "-C", str(self.path), *args], input=input, capture_output=True, env=self._env
            )
        except FileNotFoundError as exc:
            raise GitError("git is not installed", hint="install git 2.30 or newer") from exc
        if check and proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            raise GitError(f"git {args[0]} failed in {self.path}: {err[-1] if err else proc.returncode}")
        return proc.stdout

    # -- refs and ancestry ----------------------------------------------------------------
    def resolve(self, ref: str) -> str | None:
        """The commit a ref names now, or None when it does not exist."""
        out = self.run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False).strip()
        return out or None

    def branch_head(self, branch: str) -> str | None:
        return self.resolve(f"refs/heads/{branch}")

    def is_ancestor(self, older: str, newer: str) -> bool:
        proc = subprocess.run(
            ["git", "-C", str(self.path), "merge-base", "--is-ancestor", older, newer],
            capture_output=True, env=self._env,
        )
        return proc.returncode == 0

    def exists(self, sha: str) -> bool:
        return self.resolve(sha) is not None

    def merge_base(self, a: str, b: str) -> str | None:
        return self.run("merge-base", a, b, check=False).strip() or None

    # -- history --------------------------------------------------------------------------
    def first_parent_range(self, since: str | None, until: str) -> list[Commit]:
        """Commits after `since` up to `until` along first parents, oldest first."""
        rng = f"{since}..{until}" if since else until
        out = self.run("log", "--first-parent", "--reverse", f"--format={_LOG_FORMAT}", rng)
        return [c for c in (_parse_commit(rec) for rec in out.split("\x1e")) if c is not None]

    def commit(self, sha: str) -> Commit:
        out = self.run("log", "-1", f"--format={_LOG_FORMAT}", sha)
        parsed = _parse_commit(out.split("\x1e")[0])
        if parsed is None:
            raise GitError(f"no commit {sha} in {self.path}")
        return parsed

    def authors_between(self, base: str, tip: str) -> set[str]:
        """Emails and names of every author of base..tip (the commits a merge brings in)."""
        out = self.run("log", "--format=%an%x00%ae", f"{base}..{tip}")
        names: set[str] = set()
        for line in out.splitlines():
            name, _, email = line.partition("\x00")
            names.update(x.lower() for x in (name, email) if x)
        return names

    # -- diffs ----------------------------------------------------------------------------
    def diffs(
        self, pairs: Sequence[tuple[str, str | None]], paths: Iterable[str] = WATCHED_PATHS
    ) -> dict[str, list[Change]]:
        """Changes of each (new, old) pair under `paths`, in one `diff-tree --stdin`.

        `old` None = the empty tree (only for a root commit). Renames are detected (-M).
        """
        if not pairs:
            return {}
        # A lone commit on a line (a root commit) is diffed against the empty tree (--root).
        lines = [f"{new} {old}\n" if old else f"{new}\n" for new, old in pairs]
        out = self.run_bytes(
            "diff-tree", "--stdin", "--root", "-r", "-M", "--raw", "-z", "--no-abbrev", "--", *paths,
            input="".join(lines).encode(),
        )
        result: dict[str, list[Change]] = {new: [] for new, _ in pairs}
        tokens = out.split(b"\x00")
        current: str | None = None
        i = 0
        while i < len(tokens):
            tok = tokens[i].decode("utf-8", "surrogateescape")
            i += 1
            if not tok:
                continue
            if not tok.startswith(":"):
                current = tok.strip().split()[0]
                continue
            _, _, old_blob, new_blob, status = tok[1:].split(" ")
            kind = status[0]
            if kind in "RC":
                old_path = tokens[i].decode("utf-8", "surrogateescape")
                path = tokens[i + 1].decode("utf-8", "surrogateescape")
                i += 2
            else:
                old_path, path = None, tokens[i].decode("utf-8", "surrogateescape")
                i += 1
            if current is not None:
                result.setdefault(current, []).append(Change(kind, path, old_path, old_blob, new_blob))
        return result

    # -- content --------------------------------------------------------------------------
    def read_blobs(self, ids: Iterable[str]) -> dict[str, bytes]:
        """Many objects through one `cat-file --batch`: `<sha> <type> <size>\\n<data>\\n`."""
        wanted = list(dict.fromkeys(i for i in ids if i and i != ZERO))
        if not wanted:
            return {}
        out = self.run_bytes("cat-file", "--batch", input=("\n".join(wanted) + "\n").encode())
        blobs: dict[str, bytes] = {}
        pos = 0
        for oid in wanted:
            nl = out.index(b"\n", pos)
            header = out[pos:nl].decode().split()
            pos = nl + 1
            if len(header) < 3 or header[1] == "missing":
                continue
            size = int(header[2])
            blobs[oid] = out[pos : pos + size]
            pos += size + 1
        return blobs

    def blob_ids(self, commit: str, paths: Iterable[str]) -> dict[str, str]:
        """path -> blob id at `commit`, for the paths that exist there."""
        out = self.run("ls-tree", "-z", commit, "--", *paths)
        found: dict[str, str] = {}
        for entry in out.split("\x00"):
            if not entry:
                continue
            meta, _, path = entry.partition("\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == "blob":
                found[path] = parts[2]
        return found

    def tree_files(self, commit: str, prefix: str) -> dict[str, str]:
        """path -> blob of every file under `prefix` at `commit` (plan and rewrite diffs)."""
        out = self.run("ls-tree", "-r", "-z", commit, "--", prefix)
        found: dict[str, str] = {}
        for entry in out.split("\x00"):
            meta, _, path = entry.partition("\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == "blob":
                found[path] = parts[2]
        return found


def _parse_commit(record: str) -> Commit | None:
    record = record.lstrip("\n")
    if not record:
        return None
    sha, parents, name, email, ctime, message = record.split("\x00", 5)
    return Commit(sha, tuple(parents.split()), name, email, int(ctime or 0), message)
