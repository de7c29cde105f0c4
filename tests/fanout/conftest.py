"""Fixtures: the official Pub/Sub emulator in its own process group, real SQLite stores."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

EMULATOR = Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator")
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PubSubEmulator:
    """The official emulator; restartable on the same port (it forgets everything)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> None:
        log = open(self.workdir / "emulator.log", "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [str(EMULATOR), "--host=127.0.0.1", f"--port={self.port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.workdir,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"emulator exited: {(self.workdir / 'emulator.log').read_text()[-2000:]}")
            if self.answers():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("emulator did not answer in time")

    def answers(self) -> bool:
        import urllib.request

        try:  # the emulator serves REST on the same port; any HTTP answer means ready
            with urllib.request.urlopen(f"http://{self.host}/v1/projects/x/topics", timeout=1):
                return True
        except OSError as exc:
            return hasattr(exc, "code")  # an HTTP error is still an answer

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the port is free again before a restart
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.05)


@pytest.fixture(scope="session")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PubSubEmulator]:
    if not EMULATOR.exists():
        pytest.fail(f"the official Pub/Sub emulator is not installed at {EMULATOR}")
    emu = PubSubEmulator(tmp_path_factory.mktemp("pubsub-emulator"))
    emu.start()
    previous = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = emu.host
    try:
        yield emu
    finally:
        emu.stop()
        if previous is None:
            os.environ.pop("PUBSUB_EMULATOR_HOST", None)
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = previous


@pytest.fixture
def names() -> tuple[str, str]:
    """A fresh topic and subscription per test: tests share one emulator."""
    suffix = uuid.uuid4().hex[:8]
    return f"t-{suffix}", f"s-{suffix}"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"
