"""`ledger init`: a new jobs repository from the template shipped in the package."""

from __future__ import annotations

import os
import subprocess
import tempfile
from importlib.resources.abc import Traversable
from pathlib import Path

import click

from ledger import resources
from ledger.errors import LedgerError, UsageError

# The schemas editors use for the files users write (the event schema is the ledger's own).
SCHEMA_NAMES = ("job", "aliases", "policy")
BRANCH = "main"


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    for key, value in (("GIT_AUTHOR_NAME", "ledger init"), ("GIT_AUTHOR_EMAIL", "ledger@localhost")):
        env.setdefault(key, value)
        env.setdefault(key.replace("AUTHOR", "COMMITTER"), value)
    try:
        done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise LedgerError("git is not installed", hint="install git and run `ledger init` again") from None
    if done.returncode != 0:
        raise LedgerError(f"git {args[0]} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _copy_tree(source: Traversable, dest: Path) -> None:
    """Copy a package-data folder (a Traversable: a folder, or a zip entry) to `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.is_dir():
            _copy_tree(entry, dest / entry.name)
        else:
            (dest / entry.name).write_bytes(entry.read_bytes())


def lay_template(dest: Path) -> list[str]:
    """Copy the template (and the schemas editors use) into `dest`; returns the files written."""
    template = resources.template_dir()
    if not template.is_dir():
        raise LedgerError("the jobs-repo template is missing from this installation",
                          hint="reinstall tpu-ledger: pip install --force-reinstall tpu-ledger")
    _copy_tree(template, dest)
    schemas = dest / ".ledger" / "schemas"
    schemas.mkdir(parents=True, exist_ok=True)
    for name in SCHEMA_NAMES:
        (schemas / f"{name}.schema.json").write_bytes(resources.schema_file(name).read_bytes())
    return sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file() and ".git" not in p.parts)


def _commit_template(work: Path) -> None:
    _git("init", "-q", "-b", BRANCH, cwd=work)
    lay_template(work)
    _git("add", "-A", cwd=work)
    _git("-c", "commit.gpgsign=false", "commit", "-q", "-m", "Jobs repository from the tpu-ledger template", cwd=work)


def _check_empty(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} exists and is not empty", hint="give a new or empty directory")


@click.command("init")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--bare", is_flag=True, help="Create a bare hub repository (for pushes and a post-receive hook) with the template committed on main.")
def init_cmd(directory: Path, bare: bool) -> None:
    """Create a jobs repository in DIRECTORY from the template.

    It holds a README for users, examples under jobs/examples/ (single host, pod, queued
    resource, docker, conda, venv, shared TPU), .ledger/aliases.yaml and .ledger/policy.yaml,
    CODEOWNERS, a pre-commit hook and a CI workflow that run `ledger validate`, and the JSON
    Schemas editors use. The files are committed on `main`.

    \b
    Examples:
      ledger init lab-jobs                 # a working repository
      ledger init --bare /srv/git/jobs.git # a shared hub; then `git clone /srv/git/jobs.git`
    """
    _check_empty(directory)
    if bare:
        directory.mkdir(parents=True, exist_ok=True)
        _git("init", "-q", "--bare", "-b", BRANCH, str(directory))
        with tempfile.TemporaryDirectory(prefix="ledger-init-") as tmp:
            work = Path(tmp)
            _commit_template(work)
            _git("push", "-q", str(directory.resolve()), f"{BRANCH}:{BRANCH}", cwd=work)
        click.echo(f"bare jobs repository at {directory} with the template on {BRANCH}")
        click.echo(f"next: git clone {directory} && ledger install-hook {directory}")
        return
    directory.mkdir(parents=True, exist_ok=True)
    _commit_template(directory)
    click.echo(f"jobs repository at {directory} (template committed on {BRANCH})")
    click.echo("next: read README.md, copy an example from jobs/examples/ to jobs/<you>/<name>.yaml, `ledger validate`")
