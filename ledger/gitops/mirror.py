"""A remote jobs repository is watched through a local `git clone --mirror`, fetched each poll."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import git
from git.exc import UnsafeProtocolError

from ledger.gitops.repo import GitError, GitRepo

_SCP_LIKE = re.compile(r"^[\w.-]+@[\w.-]+:")


def is_remote(source: str) -> bool:
    """A URL (scheme://, file:// included, or user@host:path) rather than a local directory."""
    if "://" in source:
        return True
    return bool(_SCP_LIKE.match(source)) and not Path(source).exists()


def default_cache_dir() -> Path:
    if os.environ.get("LEDGER_CACHE_DIR"):
        return Path(os.environ["LEDGER_CACHE_DIR"]) / "mirrors"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tpu-ledger" / "mirrors"


def mirror_path(url: str, cache_dir: Path | None = None) -> Path:
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    tail = re.sub(r"[^\w.-]+", "-", url.rstrip("/").rsplit("/", 1)[-1])[:40] or "repo"
    return (cache_dir or default_cache_dir()) / f"{tail}-{digest}"


TIMEOUT_S = 600  # a clone or fetch that hangs (a dead network) is killed, then retried
_HINT = "check the repository URL and that this host can reach it"


def ensure_mirror(url: str, cache_dir: Path | None = None) -> Path:
    """The mirror's path, cloning it on first use."""
    path = mirror_path(url, cache_dir)
    if not (path / "HEAD").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)  # left by a crashed clone
        try:
            git.Git.check_unsafe_protocols(url)  # no `ext::` (runs a command) or similar
        except UnsafeProtocolError as exc:
            raise GitError(f"refusing to clone {url}: {exc}", hint="use an https://, ssh:// or file:// URL") from exc
        status, _, err = git.Git().clone(
            "--mirror", "--quiet", "--", url, str(tmp), env={"GIT_TERMINAL_PROMPT": "0"},
            kill_after_timeout=TIMEOUT_S, with_extended_output=True, with_exceptions=False,
        )
        if status != 0:
            lines = str(err).strip().splitlines()
            raise GitError(f"git clone failed: {lines[-1] if lines else status}", hint=_HINT)
        try:
            os.replace(tmp, path)  # a half-cloned mirror is never taken for a good one
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another watcher cloned it first
            if not (path / "HEAD").exists():
                raise
    return path


def fetch_mirror(repo: GitRepo) -> None:
    try:
        repo.run("fetch", "--prune", "--quiet", "origin", kill_after_timeout=TIMEOUT_S)
    except GitError as exc:
        raise GitError(exc.args[0], hint=_HINT) from exc
