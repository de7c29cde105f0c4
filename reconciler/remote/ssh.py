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
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

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

    def lookup(self, name: str) -> dict[str, paramiko.PKey]:
        import paramiko  # start-up time: paramiko (0.2 s CPU) loads at the first SSH use, not when a reconciler starts

        keys = paramiko.HostKeys()
        if self.path.exists():
            keys.load(str(self.path))
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

    def missing_host_key(self, client, hostname, key):  # noqa: ANN001 - paramiko's signature
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


def _describe(exc: BaseException | None) -> str:
    import paramiko  # start-up time: paramiko (0.2 s CPU) loads at the first SSH use, not when a reconciler starts

    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        inner = next(iter(exc.errors.values()))
        return f"{type(inner).__name__}: {inner.strerror or inner}"
    return f"{type(exc).__name__}: {exc}"


class SSHPool:
    """One live connection per worker (keyed by worker and endpoint), reused across calls."""

    def __init__(
        self,
        *,
        private_key_path: Path,
        known_hosts_path: Path,
        connect_timeout: float = 10,
        retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 10,
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
        # Told the class name of every error a command ends with (HostUnreachable, ...). Metrics hook in here.
        self.observers: list[Callable[[str], None]] = []

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
            transport.set_keepalive(15)
        return client

    def connect(self, host: Host, *, retries: int | None = None) -> paramiko.SSHClient:
        import paramiko  # start-up time: paramiko (0.2 s CPU) loads at the first SSH use, not when a reconciler starts

        slot = self._slot(host)
        with self._lock_for(slot):
            client = self._clients.get(slot)
            if client is not None:
                t = client.get_transport()
                if t is not None and t.is_active():
                    return client
                client.close()
                self._clients.pop(slot, None)
            tries = (self.retries if retries is None else retries) + 1
            last: BaseException | None = None
            for n in range(tries):
                try:
                    client = self._connect_once(host)
                    self._clients[slot] = client
                    return client
                except paramiko.AuthenticationException as exc:
                    if host.key_path is not None:
                        # A TPU created before per-job keys holds the reconciler's key: try it.
                        try:
                            client = self._connect_once(replace(host, key_path=None))
                            self._clients[slot] = client
                            return client
                        except paramiko.AuthenticationException:
                            pass
                    raise AuthFailed(f"{host.label} ({key_name(host)}): {host.username!r} was refused: {exc}") from None
                except Exception as exc:
                    if not _is_transient(exc):
                        raise
                    last = exc
                if n + 1 < tries:
                    delay = min(self.max_backoff, self.backoff * 2**n)
                    time.sleep(delay * (0.5 + random.random() / 2))
            raise HostUnreachable(
                f"{host.label} ({key_name(host)}) unreachable after {tries} tries: "
                f"{_describe(last)}"
            )

    def drop(self, host: Host) -> None:
        slot = self._slot(host)
        with self._lock_for(slot):
            client = self._clients.pop(slot, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        with self._guard:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()

    # -- commands ------------------------------------------------------------------------
    def run(
        self, host: Host, command: str, *, timeout: float, stdin: bytes | None = None,
        retries: int | None = None, idempotent: bool = False,
    ) -> CommandResult:
        """Run one exec request. A connection that died since its last use is reopened once;
        a command whose channel was lost is sent again once only when `idempotent`."""
        try:
            try:
                return self._run(host, command, timeout=timeout, stdin=stdin, retries=retries)
            except ChannelLost:
                if not idempotent:
                    raise
                return self._run(host, command, timeout=timeout, stdin=stdin, retries=retries)
        except RemoteError as exc:
            for observe in self.observers:
                observe(type(exc).__name__)
            raise

    def _run(self, host: Host, command: str, *, timeout: float, stdin: bytes | None, retries: int | None) -> CommandResult:
        for reuse in (True, False):
            client = self.connect(host, retries=retries)
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
        try:
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
                select.select([chan], [], [], min(left, 1.0))
            code = chan.recv_exit_status()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.drop(host)
            raise ChannelLost(f"{host.label} ({key_name(host)}): connection lost during the command: {exc}") from None
        finally:
            with contextlib.suppress(Exception):
                chan.close()
        return CommandResult(code, bytes(out), bytes(err))
