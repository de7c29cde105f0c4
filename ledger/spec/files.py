"""Validating job files on disk: finding the repository, collecting files, reading safely."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ledger import defaults
from ledger.spec.config import RepoConfig, load_repo_config
from ledger.spec.layout import CODEOWNERS_PATHS, CONFIG_FILES, JOB_SUFFIXES, JOBS_DIR
from ledger.spec.model import Message, SpecResult
from ledger.spec.normalize import SecretsCheck, validate_text
from ledger.spec.secrets import SecretsDir
from ledger.spec.yamlsafe import MAX_BYTES

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def find_repo_root(start: Path) -> Path:
    """The nearest directory at or above `start` holding `.ledger/` or `.git`; else `start`."""
    start = Path(start).resolve()
    here = start if start.is_dir() else start.parent
    for candidate in (here, *here.parents):
        if (candidate / ".ledger").is_dir() or (candidate / ".git").exists():
            return candidate
    return here


def is_ignored(path: str, config: RepoConfig) -> bool:
    """True for job files the policy marks as validate-only (e.g. jobs/examples/*): never run."""
    return config.policy.ignore.matches(path)


def collect(paths: list[Path], root: Path) -> list[str]:
    """Absolute paths of the job files named by `paths`: files as given, directories
    searched for *.yaml/*.yml (hidden folders skipped).

    A directory at or above the repository root means the root's `jobs/` folder, so
    `ledger validate .` does not mistake CI or pre-commit YAML for jobs.
    """
    out: list[str] = []
    seen: set[str] = set()
    for p in paths:
        absolute = os.path.abspath(p)
        if os.path.isdir(absolute):
            resolved = Path(absolute).resolve()
            if resolved == root or resolved in root.parents:
                absolute = str(root / JOBS_DIR)
                if not os.path.isdir(absolute):
                    continue
            found = []
            for dirpath, dirnames, filenames in os.walk(absolute):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                found.extend(os.path.join(dirpath, f) for f in filenames if f.endswith(JOB_SUFFIXES))
            candidates = sorted(found)
        else:
            candidates = [absolute]
        for c in candidates:
            if c not in seen:
                seen.add(c)
                out.append(c)
    return out


def relative(path: str, root: Path) -> str:
    """`path` relative to the repository root, with forward slashes."""
    prefix = str(root).rstrip(os.sep) + os.sep
    if path.startswith(prefix):
        return path[len(prefix):].replace(os.sep, "/")
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return Path(path).as_posix()


def read_limited(path: str) -> tuple[bytes, int]:
    """(at most MAX_BYTES + 1 bytes, the file's real size): enough to tell the file is too
    big without reading it all, and the size to tell the user. Refuses symlinks."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(MAX_BYTES + 1), os.fstat(fh.fileno()).st_size


def secrets_check() -> SecretsCheck | None:
    """The secrets folder's check on this host, when this host has one (the ledger host);
    elsewhere (a laptop, CI) only the references' text is checked."""
    root = defaults.secrets_dir()
    return SecretsDir(root, defaults.ssh_key()).problem if root.is_dir() else None


def validate_file(path: str | Path, root: Path, config: RepoConfig, secrets: SecretsCheck | None = None) -> SpecResult:
    path = os.path.abspath(path)
    rel = relative(path, root)
    try:
        data, size = read_limited(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            return SpecResult(rel, None, None, [Message(rel, 0, 0, "", "job files may not be symbolic links",
                                                        "replace the link with the file itself", "error")])
        return SpecResult(rel, None, None, [Message(rel, 0, 0, "", f"cannot read the file: {exc.strerror or exc}",
                                                    "check that it exists and is a readable file", "error")])
    if len(data) > MAX_BYTES:  # only the first MAX_BYTES + 1 were read: say the real size
        return SpecResult(rel, None, None, [Message(rel, 0, 0, "", f"file is {max(size, len(data)):,} bytes, over the {MAX_BYTES // 1024} KiB limit",
                                                    "a job spec is a few kilobytes: move large scripts into your code repository "
                                                    "and call them from `command.cmd`", "error")])
    return validate_text(data, rel, config, secrets=secrets)


def config_results(config: RepoConfig) -> list[SpecResult]:
    """The repo config's own problems, one result per file that has any."""
    out = []
    for file in (*CONFIG_FILES, *CODEOWNERS_PATHS):
        errors = [m for m in config.errors if m.file == file]
        if errors:
            out.append(SpecResult(file, None, None, errors, []))
    return out


def validate_paths(paths: list[Path], repo_root: Path | None = None) -> list[SpecResult]:
    """Validate files and directories (default: the repository's jobs/), config files first."""
    paths = [Path(p) for p in paths]
    root = Path(repo_root).resolve() if repo_root is not None else find_repo_root(paths[0] if paths else Path.cwd())
    if not paths:
        paths = [root / JOBS_DIR]
    config = load_repo_config(root)
    results = config_results(config)
    config_files = {str(root / f) for f in CONFIG_FILES}  # checked above, not jobs
    secrets = secrets_check()
    results.extend(validate_file(p, root, config, secrets) for p in collect(paths, root) if p not in config_files)
    return results
