"""How every `ledger` command logs: one handler on stderr, JSON lines or text, chosen by the
global options `--log-format json|text` and `--log-level` (or LEDGER_LOG_FORMAT,
LEDGER_LOG_LEVEL, or the config file).

A record carries its time (UTC), level, component (the command: `reconcile`, `watch`,
`fanout`, `notify`, `dashboard`, ...), the logger, the message, and the job and attempt it
is about: passed as `extra={"job": ..., "attempt": ...}` or set around an action by
`ledger.logcontext.about`. Any other `extra` field goes into the JSON object as it is.

Our own loggers (`tpu_ledger.*`, `ledger.*`, `reconciler.*`) log at the chosen
level; libraries (gRPC, paramiko, urllib3, uvicorn, ...) at WARNING and above, or DEBUG when
asked for it; paramiko's transport thread at DEBUG only (what it logs, the caller reports).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

from ledger import logcontext

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
OURS = ("tpu_ledger", "ledger", "reconciler")  # not "emulator": its SSH hosts log every connection
PARAMIKO = "paramiko.transport"

# What every LogRecord has: anything else on a record came from `extra` and is logged.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _time(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def fields(record: logging.LogRecord, component: str) -> dict[str, Any]:
    """The record as one flat object: time, level, component, logger, message, job, attempt,
    then the record's extra fields and, for an exception, its traceback."""
    job, attempt = logcontext.current()
    out: dict[str, Any] = {
        "time": _time(record), "level": record.levelname.lower(), "component": component,
        "logger": record.name, "message": record.getMessage(),
    }
    job = getattr(record, "job", None) or job
    attempt = getattr(record, "attempt", None) if getattr(record, "attempt", None) is not None else attempt
    if job:
        out["job"] = job
    if attempt is not None:
        out["attempt"] = attempt
    for key, value in vars(record).items():
        if key not in _STANDARD and key not in out and key not in ("job", "attempt") and not key.startswith("_"):
            out[key] = value
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(fields(record, self.component), ensure_ascii=False, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """`2026-11-25T16:30:00.123Z INFO    reconcile [alice/bert #2] provision alice/bert: done`."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        f = fields(record, self.component)
        about = ""
        if "job" in f:
            about = f"[{f['job']}" + (f" #{f['attempt']}" if "attempt" in f else "") + "] "
        line = f"{f['time']} {record.levelname:<7} {self.component} {about}{f['message']}"
        if "exc" in f:
            line += "\n" + f["exc"]
        return line


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (click's test runner swaps it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


_handler: _Stderr | None = None


def setup(log_format: str = "text", level: str = "info", component: str = "ledger") -> None:
    """Install (or replace) the one stderr handler; safe to call again."""
    global _handler
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = _Stderr()
    _handler.setFormatter(JsonFormatter(component) if log_format == "json" else TextFormatter(component))
    root.addHandler(_handler)
    chosen = getattr(logging, level.upper())
    root.setLevel(chosen if chosen == logging.DEBUG else max(chosen, logging.WARNING))
    for name in OURS:
        logging.getLogger(name).setLevel(chosen)
    # paramiko's transport thread logs, at ERROR and with a traceback, each failure it also
    # raises in the thread that connects (a host reset while it reads the banner): ours says
    # that one in a line (host unreachable, the action failed). Its records show at DEBUG only.
    logging.getLogger(PARAMIKO).setLevel(logging.DEBUG if chosen == logging.DEBUG else logging.CRITICAL + 1)


def remove() -> None:
    """Take the handler `setup` installed off the root logger (a host process that ran a
    command in-process, such as the test suite, ends what that command set up)."""
    global _handler
    if _handler is not None:
        logging.getLogger().removeHandler(_handler)
        _handler = None
