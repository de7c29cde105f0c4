"""A pool of paramiko connections, one per worker, with pinned host keys and retries.

Transient failures while connecting (refused, reset, banner timeout, EOF during the
handshake) are retried with exponential backoff and jitter; what outlives the retries is
HostUnreachable. A command's own non-zero exit is a CommandResult, never an exception. A host
key other than the pinned or recorded one is HostKeyMismatch, and is never retried.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
import random
import select
import socket
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledger import defaults
from ledger.observers import Observers
from reconciler.remote.errors import (
    AuthFailed,
    ChannelLost,
    CommandTimeout,
    HostKeyMismatch,
    HostUnreachable,
    RemoteError,
)
from reconciler.remote.types import CommandResult, Host

if TYPE_CHECKING:
    import paramiko


def key_name(host: Host) -> str:
    return host.address if host.port == 22 else f"[{host.address}]:{host.port}"


def parse_host_key(text: str) -> paramiko.PKey:
    """`"<keytype> <base64>"` (as in guest attributes and known_hosts) -> a paramiko key."""
    import paramiko  # start-up time: paramiko (0.2 s CPU) loads at the first SSH use, not when a reconciler starts

    parts = text.split()
    if len(parts) < 2:
        raise ValueError(f"host key {text!r} is not '<keytype> <base64>'")
    return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))


class KnownHosts:
    """The ledger host's known-hosts file: trust on first use, written atomically under a lock."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        # The file's content as last read, and the keys parsed from exactly that content.
        # Parsing every line at every connect made a thousand first connections quadratic
        # (paramiko's load checks each line against every key before it): 1,000 hosts took
        # minutes of CPU. Each lookup still reads the file: any change to it is seen.
        self._parsed: tuple[bytes, Any] = (b"", None)
        self._parse_lock = threading.Lock()

    def lookup(self, name: str) -> dict[str, paramiko.PKey]:
        import paramiko  # start-up time: paramiko (0.2 s CPU) loads at the first SSH use, not when a reconciler starts

        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        with self._parse_lock:
            seen, keys = self._parsed
            if keys is None or data != seen:
                if keys is not None and seen.endswith(b"\n") and data.startswith(seen):
                    tail = data[len(seen):]  # lines appended (what `record` does): load merges them as it would in one read
                else:
                    keys, tail = paramiko.HostKeys(), data
                if tail:
                    with tempfile.NamedTemporaryFile(prefix="known_hosts.") as f:
                        f.write(tail)
                        f.flush()
                        keys.load(f.name)
                self._parsed = (data, keys)
            return dict(keys.lookup(name) or {})

    def record(self, name: str, key: paramiko.PKey) -> None:
        """Add a first-seen key; refuse if another process recorded a different one meanwhile."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.path.with_suffix(self.path.suffix + ".lock"), "a") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            known = self.lookup(name)
            have = known.get(key.get_name())
            if have is not None:
                if have != key:
                    raise HostKeyMismatch(_mismatch(name, have, key, f"recorded in {self.path}"))
                return
            line = f"{name} {key.get_name()} {key.get_base64()}\n"
            old = self.path.read_text() if self.path.exists() else ""
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(old + ("" if not old or old.endswith("\n") else "\n") + line)
            os.replace(tmp, self.path)


def _fp(key: paramiko.PKey) -> str:
    return key.get_name() + " SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def _mismatch(name: str, expected: paramiko.PKey, got: paramiko.PKey, where: str) -> str:
    return (
        f"host key of {name} changed: it offered {_fp(got)} but {_fp(expected)} is {where}; "
        "refusing to connect. If the host was re-created, remove its old key and retry; "
        "otherwise treat this as a possible man-in-the-middle"
    )


class _Tofu:
    """paramiko's MissingHostKeyPolicy (duck-typed: subclassing would load paramiko at import)."""

    def __init__(self, known: KnownHosts) -> None:
        self.known = known

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.known.record(hostname, key)


_TRANSIENT = (
    ConnectionError,  # refused, reset, aborted
    TimeoutError,
    socket.timeout,
    EOFError,
    OSError,  # paramiko's NoValidConnectionsError included
)


def _is_transient(exc: BaseException) -> bool:
    import paramiko  # start-up time: paramiko (0.2 s CPU) loads at the first SSH use, not when a reconciler starts

    if isinstance(exc, HostKeyMismatch | paramiko.BadHostKeyException | paramiko.AuthenticationException):
        return False
    if isinstance(exc, paramiko.SSHException):
        text = str(exc)
        return any(s in text for s in ("banner", "Error reading SSH protocol", "EOF", "reset",
                                        "No existing session", "Unable to connect", "closed"))
    return isinstance(exc, _TRANSIENT)


def _carries_channels(client: paramiko.SSHClient) -> bool:
    t = client.get_transport()
    return t is not None and bool(getattr(t, "_channels", None) and len(t._channels))


def _describe(exc: BaseException | None) -> str:
    import paramiko  # start-up time: paramiko (0.2 s CPU) loads at the first SSH use, not when a reconciler starts

    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        inner = next(iter(exc.errors.values()))
        return f"{type(inner).__name__}: {inner.strerror or inner}"
    return f"{type(exc).__name__}: {exc}"


def _tcp_liveness(sock: object) -> None:
    """Let the kernel notice a peer that vanished without a word (a VM gone, a cable cut):
    TCP keepalives on an idle connection, and a bound on unacknowledged data (paramiko's
    keepalive messages make some), so the transport fails and its watchers close."""
    if not isinstance(sock, socket.socket):
        return
    opts = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", defaults.SSH_TCP_KEEPIDLE_S), ("TCP_KEEPINTVL", defaults.SSH_TCP_KEEPINTVL_S),
                        ("TCP_KEEPCNT", defaults.SSH_TCP_KEEPCNT),
                        ("TCP_USER_TIMEOUT", int(defaults.SSH_TCP_USER_TIMEOUT_S * 1000))):
        if hasattr(socket, name):
            opts.append((socket.IPPROTO_TCP, getattr(socket, name), int(value)))
    for level, opt, value in opts:
        with contextlib.suppress(OSError):
            sock.setsockopt(level, opt, value)


class SSHPool:
    """One live connection per host (keyed by host, user and key), reused across calls and
    shared by every channel to that host (probes, commands, watchers).

    Bounded: connections unused for `idle_close_s` (and carrying no channel) are closed, and
    beyond `max_size` the least recently used idle ones are. A host that could not be
    reached is not dialled again before its backoff step when the caller asks to `fail_fast`
    (the probes): a lost host is an observation each pass, not a storm of reconnections.
    `observers` hear (event, host label, detail) for every failure: "unreachable", "auth",
    "host_key", "channel_lost"; and "connected" for each handshake (metrics hook in here).
    """

    def __init__(
        self,
        *,
        private_key_path: Path,
        known_hosts_path: Path,
        connect_timeout: float = 10,
        retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 10,
        idle_close_s: float = defaults.SSH_IDLE_CLOSE_S,
        max_size: int = defaults.SSH_POOL_MAX,
    ) -> None:
        self.private_key_path = Path(private_key_path)
        self._pkey: paramiko.PKey | None = None  # loaded at the first connection (ensure_key checked it)
        self._pkeys: dict[Path, paramiko.PKey] = {}  # per-job keys, loaded once each
        self.known = KnownHosts(known_hosts_path)
        self.connect_timeout = connect_timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._clients: dict[tuple, paramiko.SSHClient] = {}
        self._locks: dict[tuple, threading.Lock] = {}
        self._guard = threading.Lock()
        self.idle_close_s = idle_close_s
        self.max_size = max_size
        self._used: dict[tuple, float] = {}  # slot -> monotonic time of its last use
        self._down: dict[tuple, tuple[float, int, str]] = {}  # slot -> (not before, failures in a row, last error)
        self.connects = 0  # handshakes made: reuse shows as few
        # Told (event, host label, detail) of connections and failures: `connected`, `unreachable`,
        # `auth`, `host_key`, `channel_lost`, and `command_failed` (detail: the error's class,
        # HostUnreachable, CommandTimeout, ...) for every command that ends in an error. Metrics hook in here.
        self.observers: Observers[[str, str, str]] = Observers()

    def _tell(self, event: str, host: Host, detail: str = "") -> None:
        self.observers(event, host.label, detail)

    # -- connections ---------------------------------------------------------------------
    def _slot(self, host: Host) -> tuple:
        return (host.slice, host.worker, host.address, host.port, host.username, host.host_key, host.key_path)

    @property
    def pkey(self) -> paramiko.PKey:
        import paramiko  # start-up time: paramiko (0.2 s CPU) loads at the first SSH use, not when a reconciler starts

        if self._pkey is None:
            self._pkey = paramiko.PKey.from_path(str(self.private_key_path))
        return self._pkey

    def _key_for(self, host: Host) -> paramiko.PKey:
        import paramiko  # start-up time: paramiko (0.2 s CPU) loads at the first SSH use, not when a reconciler starts

        if host.key_path is None:
            return self.pkey
        with self._guard:
            key = self._pkeys.get(host.key_path)
            if key is None:
                key = self._pkeys[host.key_path] = paramiko.PKey.from_path(str(host.key_path))
            return key

    def _lock_for(self, slot: tuple) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(slot, threading.Lock())

    def _connect_once(self, host: Host) -> paramiko.SSHClient:
        import paramiko  # start-up time: paramiko (0.2 s CPU) loads at the first SSH use, not when a reconciler starts

        client = paramiko.SSHClient()
        name = key_name(host)
        if host.host_key:
            pinned = parse_host_key(host.host_key)
            client.get_host_keys().add(name, pinned.get_name(), pinned)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            where = "pinned from the TPU API"
        else:
            for kt, k in self.known.lookup(name).items():
                client.get_host_keys().add(name, kt, k)
            client.set_missing_host_key_policy(_Tofu(self.known))
            where = f"recorded in {self.known.path}"
        try:
            client.connect(
                host.address, port=host.port, username=host.username, pkey=self._key_for(host),
                timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout, channel_timeout=self.connect_timeout,
                look_for_keys=False, allow_agent=False,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyMismatch(f"{host.label}: " + _mismatch(name, exc.expected_key, exc.key, where)) from None
        except paramiko.SSHException as exc:
            client.close()
            if host.host_key and "not found in known_hosts" in str(exc):
                # The host offered no key of the pinned type: as good as a changed key.
                raise HostKeyMismatch(f"{host.label}: {name} did not offer the key {where}") from None
            raise
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(defaults.SSH_KEEPALIVE_S)
            _tcp_liveness(transport.sock)
        with self._guard:
            self.connects += 1
        self._tell("connected", host)
        return client

    def connect(self, host: Host, *, retries: int | None = None, fail_fast: bool = False) -> paramiko.SSHClient:
        """The host's live connection, opened (with retries) when there is none. With
        `fail_fast`, a host still in its backoff step after failing is HostUnreachable at
        once, without dialling."""
        slot = self._slot(host)
        with self._lock_for(slot):
            client = self._clients.get(slot)
            if client is not None:
                t = client.get_transport()
                if t is not None and t.is_active():
                    with self._guard:
                        self._used[slot] = time.monotonic()
                    return client
                client.close()
                self._clients.pop(slot, None)
            now = time.monotonic()
            with self._guard:
                down = self._down.get(slot)
            if fail_fast and down is not None and now < down[0]:
                raise HostUnreachable(f"{host.label} ({key_name(host)}) unreachable ({down[2]}); "
                                      f"next try in {down[0] - now:.1f} s, after {down[1]} failed connection(s)")
            try:
                client = self._dial(host, slot, retries)
            except HostUnreachable as exc:
                with self._guard:
                    n = (down[1] if down else 0) + 1
                    step = min(self.max_backoff * 6, self.backoff * 2 ** min(n, 16))
                    self._down[slot] = (time.monotonic() + step * (0.5 + random.random() / 2), n,
                                        str(exc).partition(" tries: ")[2] or str(exc))
                raise
            with self._guard:
                self._down.pop(slot, None)
                self._used[slot] = time.monotonic()
                self._clients[slot] = client
        self._sweep()
        return client

    def _sweep(self) -> None:
        """Close connections nobody used for idle_close_s, and the least recently used idle
        ones beyond max_size; a connection carrying a channel (a watcher) stays."""
        now = time.monotonic()
        with self._guard:
            if len(self._clients) <= self.max_size and not any(now - t > self.idle_close_s for t in self._used.values()):
                return
            busy = {s for s, c in self._clients.items() if _carries_channels(c)}
            idle = sorted((t, s) for s, t in self._used.items() if s in self._clients and s not in busy)
            excess = len(self._clients) - self.max_size
            victims = [s for i, (t, s) in enumerate(idle) if i < excess or now - t > self.idle_close_s]
            closing = [self._clients.pop(s) for s in victims]
            for s in victims:
                self._used.pop(s, None)
            # hosts that failed long ago and were never asked for again
            self._down = {s: d for s, d in self._down.items() if now - d[0] < self.idle_close_s}
        for c in closing:
            c.close()

    def __len__(self) -> int:
        with self._guard:
            return len(self._clients)

    def _dial(self, host: Host, slot: tuple, retries: int | None) -> paramiko.SSHClient:
        import paramiko  # start-up time: paramiko (0.2 s CPU) loads at the first SSH use, not when a reconciler starts

        tries = (self.retries if retries is None else retries) + 1
        last: BaseException | None = None
        for n in range(tries):
            try:
                return self._connect_once(host)
            except paramiko.AuthenticationException as exc:
                if host.key_path is not None:
                    # A TPU created before per-job keys holds the reconciler's key: try it.
                    try:
                        return self._connect_once(replace(host, key_path=None))
                    except paramiko.AuthenticationException:
                        pass
                self._tell("auth", host, str(exc))
                raise AuthFailed(f"{host.label} ({key_name(host)}): {host.username!r} was refused: {exc}") from None
            except HostKeyMismatch as exc:
                self._tell("host_key", host, str(exc))
                raise
            except Exception as exc:
                if not _is_transient(exc):
                    raise
                last = exc
            if n + 1 < tries:
                delay = min(self.max_backoff, self.backoff * 2**n)
                time.sleep(delay * (0.5 + random.random() / 2))
        self._tell("unreachable", host, _describe(last))
        raise HostUnreachable(
            f"{host.label} ({key_name(host)}) unreachable after {tries} tries: "
            f"{_describe(last)}"
        )

    def drop(self, host: Host) -> None:
        slot = self._slot(host)
        with self._lock_for(slot), self._guard:
            client = self._clients.pop(slot, None)
            self._used.pop(slot, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        with self._guard:
            clients, self._clients = list(self._clients.values()), {}
            self._used.clear()
        for c in clients:
            c.close()

    # -- commands ------------------------------------------------------------------------
    def run(
        self, host: Host, command: str, *, timeout: float, stdin: bytes | None = None,
        retries: int | None = None, idempotent: bool = False, fail_fast: bool = False,
    ) -> CommandResult:
        """Run one exec request. A connection that died since its last use is reopened once;
        a command whose channel was lost is sent again once only when `idempotent`."""
        try:
            try:
                return self._run(host, command, timeout=timeout, stdin=stdin, retries=retries, fail_fast=fail_fast)
            except ChannelLost as exc:
                self._tell("channel_lost", host, str(exc))
                if not idempotent:
                    raise
                return self._run(host, command, timeout=timeout, stdin=stdin, retries=retries, fail_fast=fail_fast)
        except RemoteError as exc:
            self._tell("command_failed", host, type(exc).__name__)
            raise

    def open_channel(self, host: Host, *, fail_fast: bool = True) -> paramiko.Channel:
        """A new session channel on the host's connection (for a long-lived watcher)."""
        client = self.connect(host, retries=0, fail_fast=fail_fast)
        return client.get_transport().open_session(timeout=self.connect_timeout)  # type: ignore[union-attr]

    def _run(self, host: Host, command: str, *, timeout: float, stdin: bytes | None, retries: int | None,
             fail_fast: bool = False) -> CommandResult:
        for reuse in (True, False):
            client = self.connect(host, retries=retries, fail_fast=fail_fast)
            try:
                chan = client.get_transport().open_session(timeout=self.connect_timeout)  # type: ignore[union-attr]
            except Exception as exc:
                self.drop(host)
                if reuse and _is_transient(exc):
                    continue
                raise HostUnreachable(f"{host.label} ({key_name(host)}): cannot open a channel: {exc}") from None
            return self._exec(host, chan, command, timeout, stdin)
        raise AssertionError("unreachable")

    def _exec(self, host: Host, chan: paramiko.Channel, command: str, timeout: float, stdin: bytes | None) -> CommandResult:
        import paramiko  # start-up time: paramiko (0.2 s CPU) loads at the first SSH use, not when a reconciler starts

        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        # poll(), not select(): a reconciler with a thousand hosts holds descriptors past
        # FD_SETSIZE (1,024: each connection a socket, each channel waited on a pipe pair),
        # which select() refuses with "filedescriptor out of range".
        ready = select.poll()
        try:
            ready.register(chan, select.POLLIN)
            chan.exec_command(command)
            if stdin is not None:
                chan.sendall(stdin)
            chan.shutdown_write()
            while True:
                while chan.recv_ready():
                    out += chan.recv(1 << 16)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 16)
                if (chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready()
                        and (chan.eof_received or chan.closed)):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommandTimeout(f"{host.label}: command exceeded {timeout:g}s")
                if chan.closed and not chan.exit_status_ready():
                    raise ChannelLost(f"{host.label} ({key_name(host)}): channel closed without an exit status")
                ready.poll(min(left, 1.0) * 1000)
            code = chan.recv_exit_status()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.drop(host)
            raise ChannelLost(f"{host.label} ({key_name(host)}): connection lost during the command: {exc}") from None
        finally:
            with contextlib.suppress(Exception):
                chan.close()
        return CommandResult(code, bytes(out), bytes(err))
