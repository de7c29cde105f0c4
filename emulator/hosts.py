"""The SSH hosts of an emulated TPU node: real paramiko servers that run commands for real.

Each host listens on its own loopback port, accepts the public keys in the node's
`ssh-keys` metadata (Google's `user:TYPE BASE64 comment` lines), runs exec requests with
/bin/bash in its sandbox directory, serves SFTP and sets a TPU VM's environment.

Every process a host starts carries a marker variable, so `kill_processes()` finds the
ones that left their process group (setsid, daemons) too: a preempted or deleted VM
leaves nothing running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import paramiko
from paramiko.common import MSG_CHANNEL_FAILURE, MSG_CHANNEL_SUCCESS

from emulator.sftp import SandboxSFTP

MARKER = "TPU_EMULATOR_HOST_TOKEN"
# Server transports log here; a client hanging up is routine ("Connection reset by peer"),
# so nothing is printed unless the application configures logging.
logging.getLogger("emulator.ssh").addHandler(logging.NullHandler())

AuthorizedKeys = dict[str, set[tuple[str, str]]]


def parse_ssh_keys(text: str) -> AuthorizedKeys:
    """`user:ssh-rsa AAAA... comment` lines (GCE metadata `ssh-keys`) -> user -> {(type, b64)}."""
    keys: AuthorizedKeys = {}
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or ":" not in line:
            continue
        user, rest = line.split(":", 1)
        parts = rest.split()
        if len(parts) >= 2 and user:
            keys.setdefault(user.strip(), set()).add((parts[0], parts[1]))
    return keys


def new_host_key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate(bits=256)


class Acceptor:
    """One thread accepting connections for every host of an emulator (64 hosts, 1 thread)."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._pending: list[Callable[[], None]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="emulator-ssh-accept", daemon=True)
        self._thread.start()

    def _call(self, fn: Callable[[], None]) -> None:
        done = threading.Event()

        def wrapped() -> None:
            try:
                fn()
            finally:
                done.set()

        with self._lock:
            self._pending.append(wrapped)
        self._wake_w.send(b"x")
        done.wait(10)

    def add(self, sock: socket.socket, on_accept: Callable[[socket.socket], None]) -> None:
        self._call(lambda: self._sel.register(sock, selectors.EVENT_READ, on_accept))

    def remove(self, sock: socket.socket) -> None:
        def drop() -> None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(sock)
            sock.close()

        self._call(drop)

    def _run(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select():
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        self._wake_r.recv(4096)
                    with self._lock:
                        pending, self._pending = self._pending, []
                    for fn in pending:
                        fn()
                    continue
                try:
                    conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                except OSError:
                    continue
                try:
                    key.data(conn)
                except Exception:  # a broken handshake must not stop the other hosts
                    conn.close()

    def close(self) -> None:
        def stop() -> None:
            self._stop = True

        self._call(stop)
        self._thread.join(10)
        for key in list(self._sel.get_map().values()):
            if key.data is not None:
                key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()


class _Transport(paramiko.Transport):
    """Opens a channel's gate once the reply to its exec/shell request is on the wire.

    paramiko replies to a request after `check_channel_*_request` returns; a fast command's
    output, exit status and close would otherwise overtake that reply, and the client
    reports "Channel closed" for a command that ran.
    """

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self.gates: dict[int, threading.Event] = {}

    def _send_user_message(self, data) -> None:
        super()._send_user_message(data)
        raw = data.asbytes() if hasattr(data, "asbytes") else bytes(data)
        if len(raw) >= 5 and raw[0] in (MSG_CHANNEL_SUCCESS, MSG_CHANNEL_FAILURE):
            gate = self.gates.pop(struct.unpack(">I", raw[1:5])[0], None)
            if gate is not None:
                gate.set()


class _Server(paramiko.ServerInterface):
    def __init__(self, host: SSHHost) -> None:
        self.host = host
        self.home = str(host.home)
        self.env: dict[str, str] = {}
        self.user = ""

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        allowed = self.host.authorized().get(username, set())
        if (key.get_name(), key.get_base64()) in allowed:
            self.user = username
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_env_request(self, channel, name, value) -> bool:
        self.env[_text(name)] = _text(value)
        return True

    def check_channel_pty_request(self, *args) -> bool:
        return True

    def check_channel_exec_request(self, channel, command) -> bool:
        return self.host._spawn(channel, _text(command), dict(self.env), self.user)

    def check_channel_shell_request(self, channel) -> bool:
        return self.host._spawn(channel, None, dict(self.env), self.user)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class SSHHost:
    """One worker of a node: an SSH server on `bind`:`port` with a sandbox HOME."""

    def __init__(
        self,
        *,
        acceptor: Acceptor,
        home: Path,
        env: dict[str, str],
        host_key: paramiko.PKey,
        authorized: Callable[[], AuthorizedKeys],
        token: str,
        bind: str = "127.0.0.1",
    ) -> None:
        self.acceptor = acceptor
        self.home = home
        self.env = env
        self.host_key = host_key
        self.authorized = authorized
        self.token = token
        self.bind = bind
        self.port = 0
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._transports: set[paramiko.Transport] = set()
        self._runners: set[threading.Thread] = set()
        self._pgids: set[int] = set()
        self._closed = True

    # -- life cycle ---------------------------------------------------------------------
    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.bind, self.port))  # same port again after a restart when free
        sock.listen(64)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self._sock = sock
        self._closed = False
        self.acceptor.add(sock, self._accept)

    def _accept(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        with self._lock:
            if self._closed:
                conn.close()
                return
            t = _Transport(conn)
            self._transports.add(t)
        t.set_log_channel("emulator.ssh")
        t.add_server_key(self.host_key)
        t.set_subsystem_handler("sftp", paramiko.SFTPServer, SandboxSFTP)
        t.start_server(event=threading.Event(), server=_Server(self))

    def stop(self) -> None:
        """Close the listener and every session, then kill every process: a VM going away."""
        with self._lock:
            self._closed = True
            sock, self._sock = self._sock, None
            transports, self._transports = set(self._transports), set()
        if sock is not None:
            self.acceptor.remove(sock)
        for t in transports:
            with contextlib.suppress(Exception):
                t.close()
        self.kill_processes()
        with self._lock:
            runners = set(self._runners)
        for r in runners:
            r.join(10)

    @property
    def listening(self) -> bool:
        return not self._closed

    # -- processes ----------------------------------------------------------------------
    def kill_processes(self) -> int:
        """SIGKILL every process this host started, including those that called setsid."""
        killed = 0
        with self._lock:
            pgids = set(self._pgids)
        for pgid in pgids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
                killed += 1
        for _ in range(5):
            found = _marked_pids(self.token)
            if not found:
                break
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
        return killed

    def _spawn(self, channel: paramiko.Channel, command: str | None, extra: dict[str, str], user: str) -> bool:
        with self._lock:
            if self._closed:
                return False
        env = {**self.env, **extra, "USER": user or "root", "LOGNAME": user or "root", MARKER: self.token}
        argv = ["/bin/bash", "-c", command] if command is not None else ["/bin/bash"]
        gate = threading.Event()
        transport = channel.get_transport()
        if isinstance(transport, _Transport):
            transport.gates[channel.remote_chanid] = gate
        else:
            gate.set()
        try:
            proc = subprocess.Popen(
                argv,
                cwd=self.home,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError:
            return False
        with self._lock:
            self._pgids.add(proc.pid)
        runner = threading.Thread(target=self._run, args=(channel, proc, gate), name="emulator-ssh-exec", daemon=True)
        with self._lock:
            self._runners.add(runner)
        runner.start()
        return True

    def _run(self, channel: paramiko.Channel, proc: subprocess.Popen, gate: threading.Event) -> None:
        try:
            gate.wait(10)  # a client that wants no reply gets its output after this wait
            pumps = [
                threading.Thread(target=_pump_out, args=(proc.stdout, channel.sendall), daemon=True),
                threading.Thread(target=_pump_out, args=(proc.stderr, channel.sendall_stderr), daemon=True),
            ]
            feeder = threading.Thread(target=_pump_in, args=(channel, proc.stdin), daemon=True)
            for t in (*pumps, feeder):
                t.start()
            rc = proc.wait()
            for t in pumps:
                t.join()
            status = rc if rc >= 0 else 128 - rc
            with contextlib.suppress(Exception):
                channel.send_exit_status(status)
                # the client must read the status before the close: see NOTES.md
                channel.shutdown_write()
            with contextlib.suppress(Exception):
                channel.close()
            feeder.join(5)
        finally:
            with self._lock:
                self._runners.discard(threading.current_thread())
                if _group_empty(proc.pid):
                    self._pgids.discard(proc.pid)


def _pump_out(pipe, send: Callable[[bytes], None]) -> None:
    fd = pipe.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            send(data)
    except OSError:
        pass  # the client went away: closing our end gives the writer EPIPE, as sshd does
    finally:
        pipe.close()


def _pump_in(channel: paramiko.Channel, pipe) -> None:
    try:
        while True:
            data = channel.recv(65536)
            if not data:
                break
            pipe.write(data)
            pipe.flush()
    except (OSError, EOFError, ValueError):
        pass
    finally:
        with contextlib.suppress(OSError):
            pipe.close()


def _group_empty(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return False
    except ProcessLookupError:
        return True
    except PermissionError:
        return False


def reap_orphans(state_dir: Path) -> int:
    """SIGKILL host processes whose HOME lies in `state_dir`: their emulator is gone."""
    prefix = f"HOME={state_dir.resolve()}/hosts/".encode()
    marker = f"{MARKER}=".encode()
    killed = 0
    for pid, environ in _environs():
        entries = environ.split(b"\0")
        if any(e.startswith(marker) for e in entries) and any(e.startswith(prefix) for e in entries):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def _environs():
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                yield int(entry.name), f.read()
        except OSError:
            continue


def _marked_pids(token: str) -> list[int]:
    needle = f"{MARKER}={token}".encode() + b"\0"
    return [pid for pid, environ in _environs() if needle in environ + b"\0"]
