"""What a log record is about: the job and attempt an action or a probe works on.

Long-running services log through `logging`; the record's job and attempt come from here
when the code that logs does not pass them (`extra={"job": ..., "attempt": ...}`). A worker
thread sets them around the one action it runs (`with about(job, attempt): ...`), so every
line the executor, the SSH runner or the TPU adapter logs meanwhile names that job. The
formatting (JSON or text, the component) is the application shell's (ledger.app.logsetup).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_JOB: contextvars.ContextVar[str | None] = contextvars.ContextVar("ledger_log_job", default=None)
_ATTEMPT: contextvars.ContextVar[int | None] = contextvars.ContextVar("ledger_log_attempt", default=None)


@contextlib.contextmanager
def about(job: str | None, attempt: int | None = None) -> Iterator[None]:
    """Log records made inside name `job` (and `attempt`, when known)."""
    job_token = _JOB.set(job)
    attempt_token = _ATTEMPT.set(attempt)
    try:
        yield
    finally:
        _ATTEMPT.reset(attempt_token)
        _JOB.reset(job_token)


def current() -> tuple[str | None, int | None]:
    """(job, attempt) of the code running now; (None, None) outside any `about`."""
    return _JOB.get(), _ATTEMPT.get()
