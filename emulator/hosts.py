"""The SSH hosts of an emulated TPU node: real paramiko servers that run commands for real.

Each host listens on its own loopback port, accepts the public keys in the node's
`ssh-keys` metadata (Google's `user:TYPE BASE64 comment` lines), runs exec requests with
/bin/bash in its sandbox directory, serves SFTP and sets a TPU VM's environment.

Every process a host starts carries a marker variable, so `kill_processes()` finds the
ones that left their process group (setsid, daemons) too: a preempted or deleted VM
leaves nothing running.

Host hygiene (`ledger doctor`): the sandbox mirrors a TPU VM's files under its HOME, so the
product's checks run unchanged with a path prefix of `~/.vm`:
    .vm/dev/accel0..N-1       the TPU devices (N = TPU_CHIPS_PER_HOST), files a process can hold
    .vm/tmp/libtpu_lockfile   libtpu's lockfile (absent until a process or a fault makes it)
    .vm/proc/mounts           the mount table; the stand-in `gcsfuse` adds to it
    .vm/bin/                  stand-ins on PATH: `gcsfuse`, `mountpoint`, `fusermount`, and
                           `df`, which reports the simulated free disk of `fill-disk`
The faults (`stale_process`, `stale_lock`, `unmount`, `fill_disk`) change exactly these.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import shlex
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import paramiko
from paramiko.common import MSG_CHANNEL_FAILURE, MSG_CHANNEL_SUCCESS

from emulator.sftp import SandboxSFTP

MARKER = "TPU_EMULATOR_HOST_TOKEN"
ROOT = ".vm"  # the VM's root file system, as a prefix under the sandbox's HOME
LOCKFILE = f"{ROOT}/tmp/libtpu_lockfile"
MOUNTS = f"{ROOT}/proc/mounts"
DISK_FREE = f"{ROOT}/disk_free"
BIN = f"{ROOT}/bin"
# Stand-ins for tools a TPU VM has and this machine cannot run for real. Each reads and
# writes the sandbox's files only; `df` falls back to the real one unless a disk is "full".
_STANDINS = {
    "gcsfuse": r"""#!/bin/bash
# gcsfuse [flags] BUCKET MOUNTPOINT: records the mount in the sandbox's mount table
args=(); for a in "$@"; do case "$a" in -*) ;; *) args+=("$a");; esac; done
[ "${#args[@]}" -ge 2 ] || { echo "gcsfuse: need BUCKET MOUNTPOINT" >&2; exit 2; }
mkdir -p "${args[1]}" && mp=$(cd "${args[1]}" && pwd -P) || exit 1
grep -q " $mp fuse.gcsfuse " "$HOME/.vm/proc/mounts" 2>/dev/null || echo "${args[0]} $mp fuse.gcsfuse rw,nosuid,nodev 0 0" >> "$HOME/.vm/proc/mounts"
""",
    "mountpoint": r"""#!/bin/bash
# mountpoint [-q] DIR: is DIR in the sandbox's mount table?
quiet=0; dir=""; for a in "$@"; do case "$a" in -q) quiet=1;; *) dir="$a";; esac; done
mp=$(cd "$dir" 2>/dev/null && pwd -P) || mp="$dir"
if grep -q " $mp " "$HOME/.vm/proc/mounts" 2>/dev/null; then [ $quiet = 1 ] || echo "$dir is a mountpoint"; exit 0; fi
[ $quiet = 1 ] || echo "$dir is not a mountpoint"; exit 32
""",
    "fusermount": r"""#!/bin/bash
# fusermount -u DIR: drops DIR from the sandbox's mount table
dir="${@: -1}"; mp=$(cd "$dir" 2>/dev/null && pwd -P) || mp="$dir"
grep -v " $mp " "$HOME/.vm/proc/mounts" > "$HOME/.vm/proc/mounts.tmp"; mv "$HOME/.vm/proc/mounts.tmp" "$HOME/.vm/proc/mounts"
""",
    "df": r"""#!/bin/bash
# df: the real one, unless the emulator's fill-disk fault set a free figure (bytes)
[ -f "$HOME/.vm/disk_free" ] || exec /bin/df "$@"
free=$(( $(cat "$HOME/.vm/disk_free") / 1024 ))
echo "Filesystem 1024-blocks Used Available Capacity Mounted on"
for a in "$@"; do case "$a" in -*) ;; *) echo "emulated 104857600 $((104857600 - free)) $free 99% $a";; esac; done
""",
}
# Server transports log here; a client hanging up is routine ("Connection reset by peer"),
# so nothing reaches the application's log (`ledger --log-format` configures the root
# logger): attach a handler to "emulator.ssh" itself to see it.
logging.getLogger("emulator.ssh").addHandler(logging.NullHandler())
logging.getLogger("emulator.ssh").propagate = False

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

    def _send_user_message(self, data: paramiko.Message) -> None:
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

    def check_channel_env_request(self, channel: paramiko.Channel, name: bytes | str, value: bytes | str) -> bool:
        self.env[_text(name)] = _text(value)
        return True

    def check_channel_pty_request(self, *args) -> bool:
        return True

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes | str) -> bool:
        return self.host._spawn(channel, _text(command), dict(self.env), self.user)

    def check_channel_shell_request(self, channel: paramiko.Channel) -> bool:
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
        self._prepare_sandbox()
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
            # The connection ends now, as a VM going away ends it: a plain close would wait
            # for the transport's reader to leave recv() (up to its 0.1 s timeout) to send FIN.
            with contextlib.suppress(Exception):
                t.sock.shutdown(socket.SHUT_RDWR)
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

    # -- the TPU VM's files, and the faults of host hygiene ----------------------------------
    @property
    def devices(self) -> list[Path]:
        n = int(self.env.get("TPU_CHIPS_PER_HOST") or 4)
        return [self.home / ROOT / "dev" / f"accel{i}" for i in range(max(n, 1))]

    def _prepare_sandbox(self) -> None:
        """Device files, /tmp, the mount table and the stand-ins; kept across restarts."""
        for d in (f"{ROOT}/dev", f"{ROOT}/tmp", f"{ROOT}/proc", BIN):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        for dev in self.devices:
            dev.touch(exist_ok=True)
        mounts = self.home / MOUNTS
        if not mounts.exists():
            mounts.write_text(f"/dev/root {self.home} ext4 rw,relatime 0 0\n")
        for name, text in _STANDINS.items():
            path = self.home / BIN / name
            path.write_text(text)
            path.chmod(0o755)

    def stale_process(self, env: dict[str, str] | None = None, *, lock: bool = True) -> int:
        """A process that holds every device (and libtpu's lock) and belongs to no session:
        what a crashed run leaves behind. It carries `env` (e.g. a job's LEDGER_* variables,
        as a child of that job's command would) and dies with the VM. Returns its pid."""
        self._prepare_sandbox()
        opens = " ".join(f"{3 + i}<{shlex.quote(str(d))}" for i, d in enumerate(self.devices))
        script = f"exec {opens}"
        if lock:
            script += f"; exec 9>{shlex.quote(str(self.home / LOCKFILE))}; flock -n 9"
        script += "; exec sleep 86400"
        proc = subprocess.Popen(
            ["/bin/bash", "-c", script], cwd=self.home, start_new_session=True,
            env={**self.env, **(env or {}), MARKER: self.token},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        with self._lock:
            self._pgids.add(proc.pid)
        threading.Thread(target=proc.wait, name="emulator-stale-reaper", daemon=True).start()
        _wait_holding(proc.pid, self.devices[0])
        return proc.pid

    def stale_lock(self) -> str:
        """libtpu's lockfile, left behind by a process that is gone."""
        path = self.home / LOCKFILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        return str(path)

    def unmount(self, path: str | None = None) -> list[str]:
        """Drop gcsfuse mounts (all, or the one at `path`) from the mount table, as a fuse
        daemon that died leaves them. Returns the mount points dropped."""
        mounts = self.home / MOUNTS
        lines = mounts.read_text().splitlines() if mounts.exists() else []
        want = path
        if path is not None and (path == "~" or path.startswith("~/")):
            want = os.path.realpath(self.home / path[2:])  # `~` is the sandbox's HOME
        kept, dropped = [], []
        for line in lines:
            parts = line.split()
            if len(parts) >= 3 and parts[2].startswith("fuse") and (want is None or parts[1] == want):
                dropped.append(parts[1])
            else:
                kept.append(line)
        mounts.write_text("".join(f"{line}\n" for line in kept))
        return dropped

    def fill_disk(self, free: int | None) -> None:
        """`df` on this host reports `free` bytes available everywhere; None = the real disk."""
        path = self.home / DISK_FREE
        if free is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(str(int(free)))

    def _spawn(self, channel: paramiko.Channel, command: str | None, extra: dict[str, str], user: str) -> bool:
        with self._lock:
            if self._closed:
                return False
        env = {**self.env, **extra, "USER": user or "root", "LOGNAME": user or "root", MARKER: self.token}
        env["PATH"] = f"{self.home / BIN}:{env.get('PATH', os.defpath)}"
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
        with self._lock:  # started before stop() can see it: it joins only threads that run
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


def _wait_holding(pid: int, device: Path, timeout: float = 5.0) -> None:
    """Until `pid` has `device` open and has become its final `sleep`: the fault returns once
    the state it promises is true. (Before that, the `flock` it runs is a second process
    holding the same devices for a moment, and a scan may see two holders.)"""
    deadline = time.monotonic() + timeout
    target = str(device)
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep" and \
                    any(os.readlink(f"/proc/{pid}/fd/{fd}") == target for fd in os.listdir(f"/proc/{pid}/fd")):
                return
        except OSError:
            pass
        time.sleep(0.01)


def _pump_out(pipe: IO[bytes], send: Callable[[bytes], None]) -> None:
    fd = pipe.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            send(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the client went away (paramiko says EOFError mid-send): closing our end gives the writer EPIPE, as sshd does
    finally:
        pipe.close()


def _pump_in(channel: paramiko.Channel, pipe: IO[bytes]) -> None:
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


def _environs() -> Iterator[tuple[int, bytes]]:
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
