"""Install a post-receive hook in a hub repository: a push is ingested before `git push` returns."""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

import ledger
from ledger.errors import UsageError
from ledger.gitops.repo import GitRepo

MARKER = "# installed by `ledger install-hook`"


def hook_script(repo: Path, store_url: str, branch: str, python: str = sys.executable) -> str:
    q = shlex.quote
    # The hub may run hooks without the ledger package on its path: point at this one.
    pkg_root = str(Path(ledger.__file__).resolve().parent.parent)
    cmd = " ".join([
        f"PYTHONPATH={q(pkg_root)}${{PYTHONPATH:+:$PYTHONPATH}}",
        q(python), "-m", "ledger", "--store", q(store_url), "ingest",
        "--repo", q(str(repo)), "--branch", q(branch), "--quiet",
    ])
    return f"""#!/bin/sh
{MARKER}
# Pushes to refs/heads/{branch} become ledger events now; the watcher's poll is the backstop.
ingest=0
while read -r old new ref; do
  [ "$ref" = {q('refs/heads/' + branch)} ] && ingest=1
done
if [ "$ingest" = 1 ]; then
  unset GIT_DIR GIT_QUARANTINE_PATH GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES
  {cmd} || echo "ledger: ingest failed; the watcher's next poll will pick the push up" >&2
fi
exit 0
"""


def install_hook(repo: str | os.PathLike[str], store_url: str, branch: str = "main", *, force: bool = False) -> Path:
    """Write `hooks/post-receive` (executable) into the repository; returns its path."""
    with GitRepo(repo) as git:
        git_dir = git.git_dir
        custom = git.config("core.hooksPath")
    hooks = git_dir / "hooks"
    if custom:
        hooks = Path(custom) if Path(custom).is_absolute() else git_dir / custom
    hooks.mkdir(parents=True, exist_ok=True)
    target = hooks / "post-receive"
    if target.exists() and MARKER not in target.read_text(errors="replace") and not force:
        raise UsageError(
            f"{target} exists and was not written by ledger",
            hint="add the ledger line to it by hand, or pass --force to replace it",
        )
    target.write_text(hook_script(git_dir, store_url, branch))
    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return target
