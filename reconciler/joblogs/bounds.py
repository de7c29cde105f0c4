"""How much of a log file to collect: bounded per file and per job, so one job's output
cannot fill the shared place for everyone. Pure.

A collected file is the first bytes of the log, up to `file_bytes`, and the job's files
together hold at most `job_bytes`. Where a bound cuts a file, one line says so (`MARKER`);
a file that is longer than its bound holds the marker, and nothing more is collected into
it. Once the job's files reach `job_bytes`, nothing more of that job is collected.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger import defaults

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    file_bytes: int = defaults.LOG_MAX_FILE_MIB * MIB  # each attempt's output (or setup log) of each worker
    job_bytes: int = defaults.LOG_MAX_JOB_MIB * MIB  # all of a job's collected files together
    chunk_bytes: int = 4 * MIB  # at most this much per write (below the client's 8 MiB multipart limit)


@dataclass(frozen=True, slots=True)
class Shipment:
    start: int  # local offset = the collected copy's size
    end: int  # copy local bytes [start, end)
    cut: bool  # then write the marker: a bound stops this file here


def marker(limits: Limits) -> bytes:
    return (f"\n[tpu-ledger: output past this point was not collected: a job keeps at most "
            f"{limits.file_bytes // MIB} MiB per log file and {limits.job_bytes // MIB} MiB in all "
            "(--log-max-file-mib, --log-max-job-mib); the rest is on the TPU hosts and in the "
            "reconciler's --log-dir]\n").encode()


def next_shipment(local: int, stored: int, job_stored: int, limits: Limits) -> Shipment | None:
    """What to collect of a local log of `local` bytes whose collected copy has `stored`
    bytes, when the job's collected files hold `job_stored`; None when nothing."""
    if local <= stored or stored > limits.file_bytes or job_stored >= limits.job_bytes:
        return None
    room = min(limits.file_bytes - stored, limits.job_bytes - job_stored)
    take = min(local - stored, room, limits.chunk_bytes)
    return Shipment(stored, stored + take, cut=take == room and local - stored > room)
