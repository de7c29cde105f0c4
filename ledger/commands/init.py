"""`ledger init`: a new jobs repository from jobs-repo-template/."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import click

import ledger
from ledger.errors import LedgerError, UsageError

TEMPLATE_DIR = Path(ledger.__file__).resolve().parent.parent / "jobs-repo-template"
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


def lay_template(dest: Path) -> list[str]:
    """Copy the template (and the schemas editors use) into `dest`; returns the files written."""
    from ledger.spec.schema import SCHEMA_DIR

    if not TEMPLATE_DIR.is_dir():
        raise LedgerError(f"the jobs-repo template is missing at {TEMPLATE_DIR}", hint="reinstall tpu-ledger from its source tree")
    shutil.copytree(TEMPLATE_DIR, dest, dirs_exist_ok=True)
    schemas = dest / ".ledger" / "schemas"
    schemas.mkdir(parents=True, exist_ok=True)
    for name in SCHEMA_NAMES:
        shutil.copyfile(SCHEMA_DIR / f"{name}.schema.json", schemas / f"{name}.schema.json")
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


def register(group: click.Group) -> None:
    group.add_command(init_cmd)
