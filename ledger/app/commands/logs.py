"""`ledger logs`: a job's command output and setup logs, from wherever they were collected.

The reconciler's status probes fetch each host's output into its log directory
(LEDGER_LOG_DIR), and its collector copies that into the shared archive (LEDGER_LOG_ARCHIVE:
a directory, or gs://bucket/prefix). This command reads both, so any attempt shows from any
host, including attempts another reconciler ran before a takeover; it never opens SSH.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

from ledger import defaults
from ledger.app.commands.common import log_archive_option, print_json
from ledger.errors import LedgerError, UsageError
from reconciler.joblogs import DirArchive, LogFile, LogView, open_archive
from reconciler.joblogs.view import output_name, setup_names, status_name

DEFAULT_LOG_DIR_HELP = "$XDG_DATA_HOME/tpu-ledger/logs, as the reconciler"


def log_view(log_dir: str | Path | None, archive: str | None, project: str | None = None) -> LogView:
    """The shared archive, then this host's own log directory."""
    local = defaults.LOG_DIR if log_dir is None else Path(os.path.expanduser(str(log_dir)))
    return LogView([open_archive(archive or defaults.LOG_ARCHIVE, project=project), DirArchive(local)])


@click.command("logs")
@click.argument("job")
@click.option("--worker", "-w", type=int, default=0, show_default=True, help="Which host of the pod.")
@click.option("--attempt", "-a", type=int, default=None, help="Which attempt (default: the latest).")
@click.option("--setup", "show_setup", is_flag=True, help="Show the setup modules' logs before the output.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the command ends (Ctrl-C stops).")
@click.option("--log-dir", envvar="LEDGER_LOG_DIR", default=None,
              help=f"The reconciler's own log directory on this host [env: LEDGER_LOG_DIR; default: {DEFAULT_LOG_DIR_HELP}].")
@log_archive_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object: files, state and output.")
@click.option("--interval", type=float, default=0.5, show_default=True, help="Seconds between checks with --follow.")
def logs(job: str, worker: int, attempt: int | None, show_setup: bool, follow: bool, log_dir: str | None,
         log_archive: str | None, as_json: bool, interval: float) -> None:
    """Show JOB's output on one worker (0 by default), and with --setup its setup logs.

    Any attempt, whichever reconciler ran it: logs are read from the shared archive every
    reconciler collects into (--log-archive) and from this host's log directory (--log-dir),
    the longer copy of each file.

    \b
    Examples:
      ledger logs alice/llama-8b                 # latest attempt, worker 0
      ledger logs alice/llama-8b -w 3 -a 2       # worker 3 of attempt 2
      ledger logs alice/llama-8b --setup         # setup module logs, then output
      ledger logs alice/llama-8b --follow        # stream until the command ends
      ledger logs alice/llama-8b --log-archive gs://lab-logs/tpu-ledger
    """
    if follow and as_json:
        raise UsageError("--follow and --json do not mix", hint="use one or the other")
    view = log_view(log_dir, log_archive)
    found = view.files(job)
    if not found:
        raise LedgerError(f"no logs for job {job!r} in {view.where}",
                          hint="check the job id, --log-archive / LEDGER_LOG_ARCHIVE and --log-dir / LEDGER_LOG_DIR; "
                               "logs appear once the reconciler sets the job up")
    if attempt is None:
        attempt = max(found)
    elif attempt not in found:
        raise LedgerError(f"job {job!r} has no attempt {attempt}", hint=f"attempts with logs: {', '.join(map(str, found))}")
    files = found[attempt]
    out = files.get(output_name(worker))
    setups = [files[n] for n in setup_names(files, worker)]
    if out is None and not setups:
        workers = sorted({n.rsplit("_", 1)[-1].removesuffix(".log") for n in files if "_worker_" in n and n.endswith(".log")})
        raise LedgerError(f"attempt {attempt} of {job!r} has no logs for worker {worker}",
                          hint=f"workers with logs: {', '.join(workers) or 'none yet'}")
    if as_json:
        status = files.get(status_name(worker))
        print_json({
            "job": job, "attempt": attempt, "worker": worker, "attempts": list(found),
            "status": json.loads(status.read()) if status else None,
            "setup_logs": {f.name.rsplit("_worker_", 1)[0]: f.read().decode(errors="replace") for f in setups},
            "output_from": out.source.where if out else None,
            "output": out.read().decode(errors="replace") if out else "",
        })
        return
    if show_setup:
        for f in setups:
            click.echo(f"==> {f.name} <==")
            click.echo(f.read().decode(errors="replace"), nl=False)
        if setups:
            click.echo(f"==> {output_name(worker)} <==")
    offset = _copy(out, 0)
    while follow:
        # The status file appears once the reconciler saw the command end; read what is left.
        files = view.attempt(job, attempt)
        done = status_name(worker) in files
        offset = _copy(files.get(output_name(worker)), offset)
        if done:
            break
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            break


def _copy(log: LogFile | None, offset: int) -> int:
    if log is None or log.size <= offset:
        return offset
    data = log.read(offset)
    if data:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    return offset + len(data)
