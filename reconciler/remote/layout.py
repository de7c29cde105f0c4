"""Where things live, on the hosts and on the ledger host. Pure functions over strings.

Remote (relative to the login user's $HOME; the worker id is part of the path, so hosts that
share a home directory, or several workers behind one SSH server, never collide; a host of
slice s > 0 of a multislice job has `slice-<s>/` before `worker-<i>`):
    .tpu-ledger/jobs/<job>/worker-<i>/work/                    the command's working dir
    .tpu-ledger/jobs/<job>/worker-<i>/attempts/<k>/pid          process group id (setsid)
    .tpu-ledger/jobs/<job>/worker-<i>/attempts/<k>/exit_code    written atomically on exit
    .tpu-ledger/jobs/<job>/worker-<i>/attempts/<k>/output.log   stdout + stderr
    .tpu-ledger/setup/                                          setup stamps and uploaded files
    .tpu-ledger/venvs/<name>/                                   venv module
Local (`slice_<s>_worker_<i>` instead of `worker_<i>` for a host of slice s > 0):
    <log_dir>/<job>/<attempt>/<module>_worker_<i>.log   setup logs
    <log_dir>/<job>/<attempt>/output_worker_<i>.log     the command's output, fetched by offset
    <log_dir>/<job>/<attempt>/status_worker_<i>.json    final state, once exited or gone
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = ".tpu-ledger"
_SAFE = re.compile(r"[A-Za-z0-9_.-]")


def escape_segment(segment: str) -> str:
    """A path segment safe for any shell and file system: other bytes become %XX."""
    if segment in ("", ".", ".."):
        return "".join(f"%{b:02X}" for b in segment.encode()) or "%00"
    return "".join(c if _SAFE.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode()) for c in segment)


def job_rel(job_id: str) -> str:
    """`owner/name` -> `owner/name` with each segment escaped (never escapes its parent)."""
    return "/".join(escape_segment(s) for s in job_id.split("/"))


def worker_rel(job_id: str, worker: int, slice_: int = 0) -> str:
    within = f"slice-{int(slice_)}/" if slice_ else ""
    return f"{ROOT}/jobs/{job_rel(job_id)}/{within}worker-{int(worker)}"


def attempt_rel(job_id: str, worker: int, attempt: int, slice_: int = 0) -> str:
    return f"{worker_rel(job_id, worker, slice_)}/attempts/{int(attempt)}"


def host_tag(worker: int, slice_: int = 0) -> str:
    """How a host's local files are named: `worker_3`, or `slice_1_worker_3` beyond slice 0."""
    return f"slice_{int(slice_)}_worker_{int(worker)}" if slice_ else f"worker_{int(worker)}"


def home(rel: str) -> str:
    """A shell word for $HOME/<rel>: $HOME expands, <rel> is quoted."""
    return '"$HOME"/' + shlex.quote(rel)


def user_path(path: str) -> str:
    """A shell word for a path the user wrote: `~/x` is under $HOME, anything else quoted."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return home(path[2:])
    return shlex.quote(path)


def local_attempt_dir(log_dir: Path, job_id: str, attempt: int) -> Path:
    return Path(log_dir, *job_rel(job_id).split("/"), str(int(attempt)))


def local_job_dir(log_dir: Path, job_id: str) -> Path:
    return Path(log_dir, *job_rel(job_id).split("/"))


def setup_log(log_dir: Path, job_id: str, attempt: int, module: str, worker: int, slice_: int = 0) -> Path:
    return local_attempt_dir(log_dir, job_id, attempt) / f"{module}_{host_tag(worker, slice_)}.log"


def output_log(log_dir: Path, job_id: str, attempt: int, worker: int, slice_: int = 0) -> Path:
    return local_attempt_dir(log_dir, job_id, attempt) / f"output_{host_tag(worker, slice_)}.log"


def status_file(log_dir: Path, job_id: str, attempt: int, worker: int, slice_: int = 0) -> Path:
    return local_attempt_dir(log_dir, job_id, attempt) / f"status_{host_tag(worker, slice_)}.json"
