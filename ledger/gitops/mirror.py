"""A remote jobs repository is watched through a local `git clone --mirror`, fetched each poll."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from ledger.gitops.repo import GitError

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


def _git(*args: str) -> None:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    proc = subprocess.run(["git", *args], capture_output=True, env=env, timeout=600)
    if proc.returncode != 0:
        lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitError(f"git {args[0]} failed: {lines[-1] if lines else proc.returncode}",
                       hint="check the repository URL and that this host can reach it")


def ensure_mirror(url: str, cache_dir: Path | None = None) -> Path:
    """The mirror's path, cloning it on first use."""
    path = mirror_path(url, cache_dir)
    if not (path / "HEAD").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)  # left by a crashed clone
        _git("clone", "--mirror", "--quiet", url, str(tmp))
        try:
            os.replace(tmp, path)  # a half-cloned mirror is never taken for a good one
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another watcher cloned it first
            if not (path / "HEAD").exists():
                raise
    return path


def fetch_mirror(path: Path) -> None:
    _git("-C", str(path), "fetch", "--prune", "--quiet", "origin")
