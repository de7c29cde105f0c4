"""The official Pub/Sub emulator as a child process, started directly and stopped by pid."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

PUBSUB_EMULATOR = Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class PubSubEmulator:
    def __init__(self, log_path: Path, *, host: str = "127.0.0.1", port: int = 0, binary: Path = PUBSUB_EMULATOR) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.binary = binary
        self.log_path = log_path
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        if not self.binary.exists():
            raise FileNotFoundError(f"the Pub/Sub emulator is not installed at {self.binary} (gcloud components install pubsub-emulator)")
        with self.log_path.open("ab") as log:
            # its own session: the java child is stopped with the script, as one group
            self._proc = subprocess.Popen(
                [str(self.binary), f"--host={self.host}", f"--port={self.port}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"the Pub/Sub emulator exited with {self._proc.returncode}; see {self.log_path}")
            if self.answers():
                return
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"the Pub/Sub emulator did not listen on {self.endpoint} within {timeout:.0f} s; see {self.log_path}")

    def answers(self) -> bool:
        """The emulator serves REST on its gRPC port; any HTTP answer means it is ready
        (the port opens a moment before the service behind it does)."""
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/v1/projects/x/topics", timeout=1):
                return True
        except OSError as exc:
            return hasattr(exc, "code")  # an HTTP error is still an answer

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # the group may outlive the script (java); make sure nothing of it stays
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the port is free again before a restart on it
            with socket.socket() as s:
                if s.connect_ex((self.host, self.port)) != 0:
                    return
            time.sleep(0.05)
