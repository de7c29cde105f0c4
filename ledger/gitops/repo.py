"""The jobs repository through GitPython: commits, first-parent ranges, tree diffs, blobs.

A `git.Repo` holds the repository. Reading a branch head is GitPython's own reading of the
ref files (no process); blobs come through its persistent `git cat-file --batch`, which
lives as long as the GitRepo (no process per read either). The bulk calls go through the
`repo.git` wrapper, batched so that ingesting a long backlog costs a fixed number of git
processes (one `log`, one `diff-tree --stdin` per chunk), not one per commit.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import git
from git.exc import GitCommandNotFound, InvalidGitRepositoryError, NoSuchPathError
from git.refs.symbolic import SymbolicReference

from ledger.errors import LedgerError
from ledger.spec.layout import CODEOWNERS_PATHS, JOBS_DIR, LEDGER_DIR, is_governed

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
    committer_name: str = ""
    committer_email: str = ""
    # (key lowercased, value) of the trailer block as git parses it (`%(trailers:unfold)`):
    # continuation lines joined, git's rules for what a trailer block is.
    trailers: tuple[tuple[str, str], ...] = ()

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


# Records and trailers are split at random markers chosen per call: a commit message is
# written by whoever pushes, so no fixed separator can be trusted not to occur in it.
_FIELDS = "%H%x00%P%x00%an%x00%ae%x00%cn%x00%ce%x00%ct%x00"


def _log_format() -> tuple[str, str, str, str]:
    """(format, record mark, trailer mark, key mark) for one `git log`."""
    record, trailer, key = (f"\x1e{secrets.token_hex(8)}" for _ in range(3))
    hexed = [m.replace("\x1e", "%x1e") for m in (record, trailer, key)]
    fmt = (f"{hexed[0]}{_FIELDS}%(trailers:only,unfold,separator={hexed[1]},key_value_separator={hexed[2]})"
           "%x00%B")
    return fmt, record, trailer, key


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
        return self._log("--first-parent", "--reverse", rng)

    def commit(self, sha: str) -> Commit:
        parsed = self._log("-1", sha)
        if not parsed:
            raise GitError(f"no commit {sha} in {self.path}")
        return parsed[0]

    def _log(self, *args: str) -> list[Commit]:
        fmt, record, trailer, key = _log_format()
        out = self.run("log", f"--format={fmt}", *args)
        return [c for c in (_parse_commit(rec, trailer, key) for rec in out.split(record)) if c is not None]

    def path_authors(self, base: str, tip: str, paths: Iterable[str] = WATCHED_PATHS) -> dict[str, list[tuple[str, str]]]:
        """path -> (name, email) of each author of base..tip whose commit touched it, oldest
        first: who wrote what a merge brings in."""
        mark = f"\x1e{secrets.token_hex(8)}"
        out = self.run_bytes("log", "--reverse", "--no-merges", "--name-only", "-z",
                             f"--format={mark.replace(chr(0x1e), '%x1e')}%an%x00%ae",
                             f"{base}..{tip}", "--", *paths).decode("utf-8", "surrogateescape")
        found: dict[str, list[tuple[str, str]]] = {}
        for rec in out.split(mark)[1:]:  # `name NUL email NUL LF path NUL path NUL ...`
            name, email, files = (rec.split("\x00", 2) + ["", ""])[:3]
            for path in files.lstrip("\n").split("\x00"):
                if path and (name, email) not in found.setdefault(path, []):
                    found[path].append((name, email))
        return found

    def commit_object(self, sha: str) -> bytes:
        """The raw commit object (`git cat-file commit`): what a signature signs, and the signature."""
        return self.run_bytes("cat-file", "commit", sha)

    def verify_openpgp(self, sha: str, gnupg_home: Path | None = None) -> tuple[bool, str]:
        """`git verify-commit --raw` of an OpenPGP signature against the keyring in
        `gnupg_home`: (verified, what git and gpg said). SSH signatures are checked by the
        project's own verifier (ledger.gitops.signed), never here."""
        env = {"GNUPGHOME": str(gnupg_home)} if gnupg_home is not None else None
        status, out, err = self.repo.git.execute(
            ["git", "-c", "gpg.program=gpg", "verify-commit", "--raw", sha],
            with_extended_output=True, with_exceptions=False, env=env,
        )
        return status == 0, "\n".join(x for x in (str(out).strip(), str(err).strip()) if x)

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

    def governed_files(self, commit: str) -> dict[str, str]:
        """path -> blob of every governed file at `commit` (everything under .ledger/ and
        each CODEOWNERS), in one `ls-tree`."""
        out = self.run("ls-tree", "-r", "-z", commit, "--", f"{LEDGER_DIR}/", *CODEOWNERS_PATHS)
        return {p: b for p, b in _blob_entries(out).items() if is_governed(p)}

    def tree_files(self, commit: str, prefix: str) -> dict[str, str]:
        """path -> blob of every file under `prefix` at `commit` (plan and rewrite diffs)."""
        return _blob_entries(self.run("ls-tree", "-r", "-z", commit, "--", prefix))


def _blob_entries(out: str) -> dict[str, str]:
    """path -> blob of the blob entries of `ls-tree -z` output."""
    found: dict[str, str] = {}
    for entry in out.split("\x00"):
        meta, _, path = entry.partition("\t")
        parts = meta.split()
        if len(parts) == 3 and parts[1] == "blob":
            found[path] = parts[2]
    return found


def _parse_commit(record: str, trailer_mark: str, key_mark: str) -> Commit | None:
    record = record.lstrip("\n")
    if not record:
        return None
    sha, parents, name, email, cname, cemail, ctime, rest = record.split("\x00", 7)
    # The trailers come before the message and cannot hold NUL; the message may.
    trailers, _, message = rest.partition("\x00")
    pairs = []
    for item in trailers.split(trailer_mark):
        k, sep, v = item.partition(key_mark)
        if sep:
            pairs.append((k.strip().lower(), v.strip()))
    return Commit(sha, tuple(parents.split()), name, email, int(ctime or 0), message, cname, cemail, tuple(pairs))
