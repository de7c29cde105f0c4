"""The log records' shape: JSON objects (time, level, component, logger, message, job, attempt,
extra fields, exception) or text lines; the job from `ledger.logcontext.about` or `extra`."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading

from click.testing import CliRunner

from ledger import logcontext
from ledger.app import logsetup
from ledger.app.cli import cli
from ledger.store.sqlite import SQLiteStore


def record(message: str, level: int = logging.INFO, **extra) -> logging.LogRecord:
    return logging.getLogger("tpu_ledger.test").makeRecord("tpu_ledger.test", level, __file__, 1, message, (), None,
                                                           extra=extra or None)


def test_json_lines_carry_the_job_from_the_context_or_extra():
    fmt = logsetup.JsonFormatter("reconcile")
    with logcontext.about("alice/bert", 2):
        line = json.loads(fmt.format(record("provision alice/bert: done", action="provision")))
    assert line["component"] == "reconcile" and line["level"] == "info" and line["logger"] == "tpu_ledger.test"
    assert (line["job"], line["attempt"], line["action"]) == ("alice/bert", 2, "provision")
    assert line["time"].endswith("Z") and line["message"] == "provision alice/bert: done"
    outside = json.loads(fmt.format(record("idle")))
    assert "job" not in outside and "attempt" not in outside
    assert json.loads(fmt.format(record("x", job="bob/eval", attempt=0)))["attempt"] == 0


def test_the_context_is_per_thread():
    seen = {}

    def other() -> None:
        seen["other"] = logcontext.current()

    with logcontext.about("alice/bert", 1):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        seen["here"] = logcontext.current()
    assert seen == {"other": (None, None), "here": ("alice/bert", 1)} and logcontext.current() == (None, None)


def test_text_lines_and_exceptions():
    fmt = logsetup.TextFormatter("watch")
    with logcontext.about("alice/bert", 3):
        line = fmt.format(record("ingested"))
    assert line.endswith(" INFO    watch [alice/bert #3] ingested")
    try:
        raise ValueError("boom")
    except ValueError:
        rec = record("failed", logging.ERROR)
        rec.exc_info = sys.exc_info()
    assert "ValueError: boom" in json.loads(logsetup.JsonFormatter("watch").format(rec))["exc"]


def test_the_global_options_shape_what_a_command_logs():
    """Through the CLI: the global options install the handler with their format and level."""
    try:
        result = CliRunner().invoke(cli, ["--log-format", "json", "--log-level", "warning", "config", "--json"])
        assert result.exit_code == 0
        handler = logsetup._handler
        assert handler is not None and isinstance(handler.formatter, logsetup.JsonFormatter)
        assert handler.formatter.component == "config"
        assert logging.getLogger("tpu_ledger").level == logging.WARNING
        assert logging.getLogger("paramiko").getEffectiveLevel() >= logging.WARNING
    finally:  # the next test in this process logs as the CLI's default does
        logsetup.setup()


def test_a_crash_in_native_code_leaves_the_python_stack_in_the_log(tmp_path):
    """A reconciler that died of SIGSEGV in a chaos run said nothing: every command now
    enables faulthandler, so the service's log shows where each thread was."""
    crash = (  # `ledger verify`, with a verify that dies in C
        "import ctypes\n"
        "from ledger.app.cli import cli\n"
        "from ledger.app.commands import verify\n"
        "def crash_here(*args, **kwargs):\n"
        "    ctypes.string_at(0)\n"
        "verify.verify_ledger = crash_here\n"
        "cli(['--store', 'sqlite:///" + str(tmp_path / "l.db") + "', 'verify'])\n"
    )
    SQLiteStore(tmp_path / "l.db").close()
    done = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert "in crash_here" in done.stderr


def test_paramikos_transport_thread_logs_only_when_debugging():
    """Chaos found it: a host reset while paramiko read its SSH banner put a 20-line
    traceback from paramiko's own thread into the reconciler's log, beside the line the
    reconciler writes for the same failure. That thread's logger shows records at DEBUG only."""
    transport = logging.getLogger(logsetup.PARAMIKO)
    try:
        logsetup.setup(level="info", component="reconcile")
        assert not transport.isEnabledFor(logging.ERROR) and not transport.isEnabledFor(logging.CRITICAL)
        assert logging.getLogger("reconciler.loop").isEnabledFor(logging.INFO)
        assert logging.getLogger("paramiko").isEnabledFor(logging.WARNING)  # paramiko's other loggers as every library's
        logsetup.setup(level="debug", component="reconcile")
        assert transport.isEnabledFor(logging.DEBUG)
    finally:
        logsetup.setup()


def test_remove_takes_the_commands_handler_off_the_root_logger():
    """What the suite does after each test: a thread of another test then logs nowhere of ours."""
    logsetup.setup(component="list")
    installed = logsetup._handler
    assert installed in logging.getLogger().handlers
    logsetup.remove()
    assert installed not in logging.getLogger().handlers and logsetup._handler is None
    logsetup.remove()  # twice is harmless
