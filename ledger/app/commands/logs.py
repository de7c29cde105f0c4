"""`ledger logs`: a job's command output and setup logs, as fetched from its hosts.

The reconciler's status probes fetch each host's output by offset into the local log
directory (LEDGER_LOG_DIR); this command reads that directory and never opens SSH itself.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import click

from ledger import defaults
from ledger.app.commands.common import print_json
from ledger.errors import LedgerError, UsageError
from reconciler.remote import layout

DEFAULT_LOG_DIR_HELP = "$XDG_DATA_HOME/tpu-ledger/logs, as the reconciler"


def _attempts(job_dir: Path) -> list[int]:
    if not job_dir.is_dir():
        return []
    return sorted(int(p.name) for p in job_dir.iterdir() if p.is_dir() and p.name.isdigit())


def _setup_logs(adir: Path, worker: int, slice_: int = 0) -> list[Path]:
    """The setup modules' logs of one host: `<module>_<tag>.log` (module names have no `_`)."""
    own = re.compile(rf"[a-z]+_{re.escape(layout.host_tag(worker, slice_))}\.log")
    return sorted(p for p in adir.iterdir() if own.fullmatch(p.name) and not p.name.startswith("output_"))


@click.command("logs")
@click.argument("job")
@click.option("--worker", "-w", type=int, default=0, show_default=True, help="Which host of the pod (within its slice).")
@click.option("--slice", "-s", "slice_", type=int, default=0, show_default=True, help="Which slice of a multislice job.")
@click.option("--attempt", "-a", type=int, default=None, help="Which attempt (default: the latest).")
@click.option("--setup", "show_setup", is_flag=True, help="Show the setup modules' logs before the output.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the command ends (Ctrl-C stops).")
@click.option("--log-dir", envvar="LEDGER_LOG_DIR", default=None,
              help=f"Where the reconciler keeps job logs [env: LEDGER_LOG_DIR; default: {DEFAULT_LOG_DIR_HELP}].")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: files, state and output.")
@click.option("--interval", type=float, default=0.5, show_default=True, help="Seconds between checks with --follow.")
def logs(job: str, worker: int, slice_: int, attempt: int | None, show_setup: bool, follow: bool, log_dir: str | None,
         as_json: bool, interval: float) -> None:
    """Show JOB's output on one worker (0 by default), and with --setup its setup logs.

    \b
    Examples:
      ledger logs alice/llama-8b                 # latest attempt, worker 0
      ledger logs alice/llama-8b -w 3 -a 2       # worker 3 of attempt 2
      ledger logs alice/maxtext -s 1 -w 0        # worker 0 of slice 1 (multislice)
      ledger logs alice/llama-8b --setup         # setup module logs, then output
      ledger logs alice/llama-8b --follow        # stream until the command ends
    """
    if follow and as_json:
        raise UsageError("--follow and --json do not mix", hint="use one or the other")
    root = defaults.LOG_DIR if log_dir is None else Path(os.path.expanduser(log_dir))
    job_dir = layout.local_job_dir(root, job)
    attempts = _attempts(job_dir)
    if not attempts:
        raise LedgerError(f"no logs for job {job!r} under {root}",
                          hint="check the job id and --log-dir / LEDGER_LOG_DIR; logs appear once the reconciler sets the job up")
    if attempt is None:
        attempt = attempts[-1]
    elif attempt not in attempts:
        raise LedgerError(f"job {job!r} has no attempt {attempt}", hint=f"attempts with logs: {', '.join(map(str, attempts))}")
    adir = layout.local_attempt_dir(root, job, attempt)
    out = layout.output_log(root, job, attempt, worker, slice_)
    status_path = layout.status_file(root, job, attempt, worker, slice_)
    setups = _setup_logs(adir, worker, slice_)
    if not out.exists() and not setups:
        tags = sorted({p.stem.split("_", 1)[1].replace("_", " ") for p in adir.glob("*_worker_*.log")})
        host = f"slice {slice_} worker {worker}" if slice_ else f"worker {worker}"
        raise LedgerError(f"attempt {attempt} of {job!r} has no logs for {host}",
                          hint=f"hosts with logs: {', '.join(tags) or 'none yet'}")
    if as_json:
        status = json.loads(status_path.read_text()) if status_path.exists() else None

        print_json({
            "job": job, "attempt": attempt, "worker": worker, "slice": slice_, "attempts": attempts, "status": status,
            "setup_logs": {p.name.split("_", 1)[0]: p.read_text(errors="replace") for p in setups},
            "output_path": str(out),
            "output": out.read_text(errors="replace") if out.exists() else "",
        })
        return
    if show_setup:
        for p in setups:
            click.echo(f"==> {p.name} <==")
            click.echo(p.read_text(errors="replace"), nl=False)
        if setups:
            click.echo(f"==> {out.name} <==")
    offset = _copy(out, 0)
    while follow:
        # The status file appears once the reconciler saw the command end; read what is left.
        done = status_path.exists()
        offset = _copy(out, offset)
        if done:
            break
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            break


def _copy(path: Path, offset: int) -> int:
    if not path.exists():
        return offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    if data:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    return offset + len(data)
