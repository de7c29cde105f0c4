"""`ledger validate`: check job specs (and the repo's .ledger/ files) before they are merged."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ledger.app.commands.common import print_json
from ledger.errors import UsageError
from ledger.spec.files import validate_paths


@click.command("validate")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--repo", "repo", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Jobs repository root (default: found from the first PATH or the current directory).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of text: one object per file (path, job_id, ok, spec_hash, errors, warnings).")
@click.option("--quiet", "-q", is_flag=True, help="Print errors only, no warnings or summary.")
@click.option("--show-spec", is_flag=True, help="Also print each valid job's normalized spec (defaults filled, aliases resolved).")
def validate_cmd(paths: tuple[Path, ...], repo: Path | None, as_json: bool, quiet: bool, show_spec: bool) -> None:
    """Validate job files: jobs/<owner>/<name>.yaml against schemas/job.schema.json and more.

    PATH may be files or directories (default: the repository's jobs/ folder). Each problem
    is printed as FILE:LINE:COLUMN, the field as a JSON pointer, what is wrong and a hint.
    `.ledger/aliases.yaml` and `.ledger/policy.yaml` are checked too.

    \b
    Exit status: 0 all valid, 1 some file invalid, 2 bad usage (e.g. a missing PATH).
    \b
    Examples:
      ledger validate                      # every job in this repository
      ledger validate jobs/alice/bert.yaml # one file
      ledger validate --json jobs/ | jq '.[] | select(.ok | not)'
    """
    for p in paths:
        if not p.exists() and not p.is_symlink():
            raise UsageError(f"no such file or directory: {p}", hint="give job files or folders that exist")
    results = validate_paths(list(paths), repo)
    if as_json:
        print_json([{**r.to_dict(), **({"spec": r.spec} if show_spec else {})} for r in results])
    else:
        for r in results:
            for m in r.errors + ([] if quiet else r.warnings):
                click.echo(m.format(), err=False)
            if show_spec and r.spec is not None:
                click.echo(f"# {r.path} ({r.job_id})")
                click.echo(json.dumps(r.spec, indent=2, ensure_ascii=False))
        if not quiet:
            bad = sum(1 for r in results if not r.ok)
            warned = sum(len(r.warnings) for r in results)
            status = "ok" if not bad else f"{bad} invalid"
            click.echo(f"{len(results)} file(s) checked: {status}, {warned} warning(s)", err=True)
    if any(not r.ok for r in results):
        click.get_current_context().exit(1)
