"""Service processes in tests, stopped as systemd stops them."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def service(argv: list[str], **popen: Any) -> Iterator[subprocess.Popen]:
    """A process with stdout and stderr piped (text); killed at the end if still running."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def stop_with_sigterm(proc: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:
    """SIGTERM, then what the process wrote until it exited (it is killed if it outlives `timeout`)."""
    proc.send_signal(signal.SIGTERM)
    return proc.communicate(timeout=timeout)


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM if it still runs, then wait; killed if it outlives `timeout` (a fixture's teardown)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
