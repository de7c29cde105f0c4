"""The jobs repository through GitPython: commits, first-parent ranges, tree diffs, blobs.

A `git.Repo` holds the repository. Reading a branch head is GitPython's own reading of the
ref files (no process); blobs come through its persistent `git cat-file --batch`, which
lives as long as the GitRepo (no process per read either). The bulk calls go through the
`repo.git` wrapper, batched so that ingesting a long backlog costs a fixed number of git
processes (one `log`, one `diff-tree --stdin` per chunk), not one per commit.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import git
from git.exc import GitCommandNotFound, InvalidGitRepositoryError, NoSuchPathError
from git.refs.symbolic import SymbolicReference

from ledger.errors import LedgerError
from ledger.spec.layout import CODEOWNERS_PATHS, JOBS_DIR, LEDGER_DIR

ZERO = "0" * 40
# Paths whose changes the watcher looks at: job specs and the files that govern approval.
WATCHED_PATHS = (f"{JOBS_DIR}/", f"{LEDGER_DIR}/", *CODEOWNERS_PATHS)
# Up to this many objects are read through the persistent `cat-file`, more through a batch:
# one by one costs 0.1-0.2 ms an object, a batch process 3-4 ms to start (measured here, 2
# shared cores), so the batch wins from a few dozen objects on.
PERSISTENT_READS = 32


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
    """One jobs repository. Not for sharing between threads (GitPython's persistent
    `cat-file` is not thread-safe): each watcher or command opens its own."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.repo = git.Repo(self.path, search_parent_directories=True)
        except (NoSuchPathError, InvalidGitRepositoryError) as exc:
            raise GitError(f"{self.path} is not a git repository", hint="check --repo") from exc
        self.git_dir = Path(self.repo.git_dir).resolve()
        # Every git process works on this repository, whatever the caller's environment says
        # (a hook runs with GIT_DIR set for the hub), and never waits for a password.
        self.repo.git.update_environment(GIT_DIR=str(self.git_dir), GIT_TERMINAL_PROMPT="0")

    def close(self) -> None:
        """Stop the persistent `cat-file` processes; the object stays usable (they restart)."""
        self.repo.close()

    def __enter__(self) -> GitRepo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------
    def run(self, *args: str, input: bytes | None = None, check: bool = True, **options: Any) -> str:
        return self.run_bytes(*args, input=input, check=check, **options).decode("utf-8", "replace")

    def run_bytes(self, *args: str, input: bytes | None = None, check: bool = True, **options: Any) -> bytes:
        """`git <args>` through the repo's `git` wrapper; stdout as bytes (commit messages
        and paths are decoded by the caller, never by guesswork). `options` go to GitPython
        (e.g. kill_after_timeout)."""
        command, *rest = args
        call = getattr(self.repo.git, command.replace("-", "_"))
        try:
            if input is None:
                status, out, err = call(*rest, with_extended_output=True, with_exceptions=False,
                                        stdout_as_string=False, strip_newline_in_stdout=False, **options)
            else:
                handle = call(*rest, as_process=True, istream=subprocess.PIPE, **options)
                out, err = handle.proc.communicate(input)
                status = handle.proc.returncode
        except GitCommandNotFound as exc:
            raise GitError("git is not installed", hint="install git 2.30 or newer") from exc
        if check and status != 0:
            lines = (err.decode("utf-8", "replace") if isinstance(err, bytes) else str(err)).strip().splitlines()
            raise GitError(f"git {command} failed in {self.path}: {lines[-1] if lines else status}")
        return out

    # -- refs and ancestry ----------------------------------------------------------------
    def resolve(self, ref: str) -> str | None:
        """The commit a ref names now, or None when it does not exist."""
        out = self.run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False).strip()
        return out or None

    def branch_head(self, branch: str) -> str | None:
        """The branch's commit: read from the ref files by GitPython (loose, then packed-refs),
        no process. A ref it cannot read (absent, or another ref store such as reftable) is
        asked of git itself."""
        try:
            return SymbolicReference.dereference_recursive(self.repo, f"refs/heads/{branch}")
        except ValueError:
            return self.resolve(f"refs/heads/{branch}")

    def is_ancestor(self, older: str, newer: str) -> bool:
        status, _, _ = self.repo.git.merge_base(
            "--is-ancestor", older, newer, with_extended_output=True, with_exceptions=False,
        )
        return status == 0

    def exists(self, sha: str) -> bool:
        return self.resolve(sha) is not None

    def merge_base(self, a: str, b: str) -> str | None:
        return self.run("merge-base", a, b, check=False).strip() or None

    def config(self, key: str) -> str | None:
        """A git config value as git itself reads it for this repository (every level, keys
        case-insensitive), or None."""
        return self.run("config", "--get", key, check=False).strip() or None

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
        """Objects by id (missing ones left out).

        A push brings a few: they are asked of the repo's persistent `cat-file --batch`, no
        process started. A backlog brings hundreds: one request and answer per object costs
        more than a process, so they go through one `cat-file --batch` of their own.
        """
        wanted = list(dict.fromkeys(i for i in ids if i and i != ZERO))
        if len(wanted) > PERSISTENT_READS:
            return self._read_batch(wanted)
        blobs: dict[str, bytes] = {}
        for oid in wanted:
            try:
                _, _, _, data = self.repo.git.get_object_data(oid)
            except ValueError as exc:
                if "missing" in str(exc):  # `<oid> missing`: not in the repository
                    continue
                self._broken_cat_file(exc)
            except OSError as exc:  # the process died (broken pipe)
                self._broken_cat_file(exc)
            blobs[oid] = data
        return blobs

    def _read_batch(self, wanted: list[str]) -> dict[str, bytes]:
        """`<sha> <type> <size>\\n<data>\\n` per object, from one `cat-file --batch`."""
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

    def _broken_cat_file(self, exc: Exception) -> NoReturn:
        # Never take a failed read for an empty file: drop the process (the next read starts
        # a new one) and fail this ingest; the watcher retries at its next wake-up.
        self.repo.git.clear_cache()
        raise GitError(f"git cat-file failed in {self.path}: {exc}") from exc

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
