"""Watchers: one long-lived channel per (attempt, host) over the host's persistent connection.

A watcher runs `scripts.watch_script` on the host: the attempt's output streams in on its
stdout as it is written, and a control line on stderr says when the attempt's wrapper has
exited (the host learns it from a lock the wrapper holds: nothing polls). One thread serves
every watcher through a selector over the channels, so a thousand hosts cost one thread and
no traffic while nothing happens.

When a watcher's channel closes, for whatever reason (the attempt ended, the host went away,
the connection dropped), `on_change(job_id)` is called at once: the reconciler wakes and
looks (the TPU API decides what a lost host means). A watcher is never re-armed from here:
the next probe of that host re-arms it, over a connection the pool reopens with backoff.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import select
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reconciler.remote import scripts

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger("tpu_ledger.remote")

Key = tuple[str, int, int]  # (job id, attempt, host id)
BUFFER_MAX = 8 << 20  # bytes held per watcher between passes; beyond it, flow control holds the host
SWEEP_EVERY = 1.0  # seconds: the longest a wake-up lost by paramiko's pipe goes unnoticed (`_sweep`)


@dataclass
class _Watch:
    key: Key
    chan: paramiko.Channel
    label: str
    buf: bytearray = field(default_factory=bytearray)
    control: bytearray = field(default_factory=bytearray)
    fd: int | None = None  # the descriptor the selector holds it under, while it does
    ended: bool = False  # the channel closed
    finished: bool = False  # ... after the host said the attempt ended
    paused: bool = False  # unregistered while its buffer is full


def _more_files() -> None:
    """A watcher holds a socket and a pipe pair: a thousand hosts need more descriptors than
    the usual soft limit of 1,024. Raise it to the hard limit (no privilege needed)."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 1 << 16
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class Watchers:
    def __init__(self, on_change: Callable[[str], None] | None = None) -> None:
        _more_files()
        self.on_change: list[Callable[[str], None]] = [on_change] if on_change else []
        self._watches: dict[Key, _Watch] = {}
        self._legacy: set[Key] = set()
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._pending: list[Callable[[], None]] = []
        self._stopped = False
        self._thread: threading.Thread | None = None

    # -- what the runner asks ---------------------------------------------------------------
    def live(self, key: Key) -> bool:
        with self._lock:
            w = self._watches.get(key)
            return w is not None and not w.ended

    def take(self, key: Key, limit: int, whole_lines: bool = True) -> bytes | None:
        """The output received since the last take (`whole_lines`: whole lines only, all of
        it past `limit`), or None when no live watcher holds this key."""
        with self._lock:
            w = self._watches.get(key)
            if w is None or w.ended:
                return None
        if _peer_closed(w.chan):  # the connection's end is in flight: no answer from here
            self._call(lambda: self._read(w))
            return None
        with self._lock:
            end = len(w.buf) if not whole_lines or len(w.buf) >= limit else w.buf.rfind(b"\n") + 1
            data = bytes(w.buf[:end])
            del w.buf[:end]
            resume = w.paused and len(w.buf) < BUFFER_MAX
            if resume:
                w.paused = False
        if resume:
            self._call(lambda: self._register(w))
        return data

    def arm(self, key: Key, chan: paramiko.Channel, label: str) -> None:
        """Watch `chan` (its watch_script already sent) under `key`, replacing any other."""
        w = _Watch(key, chan, label)
        with self._lock:
            old = self._watches.get(key)
            self._watches[key] = w
        if old is not None:
            self._drop(old)
        self._ensure_thread()
        self._call(lambda: self._register(w))

    def forget(self, keep: Callable[[Key], bool]) -> None:
        """Close the watchers whose key `keep` refuses (attempts no longer running)."""
        with self._lock:
            gone = [w for k, w in self._watches.items() if not keep(k)]
            for w in gone:
                del self._watches[w.key]
        for w in gone:
            self._drop(w)

    def __len__(self) -> int:
        with self._lock:
            return sum(not w.ended for w in self._watches.values())

    def close(self) -> None:
        with self._lock:
            if self._stopped:
                return
            watches, self._watches = list(self._watches.values()), {}
            self._stopped = True
        for w in watches:
            with contextlib.suppress(Exception):
                w.chan.close()
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(5)
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- the selector thread -------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="ssh-watchers", daemon=True)
                self._thread.start()

    def _call(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._pending.append(fn)
        os.write(self._wake_w, b"x")

    # A watch is held in the selector by its channel's descriptor number, and only the watch
    # registered under a number may unregister it: closing a paramiko channel closes that
    # descriptor, the kernel hands its number to the next file opened, and a registration
    # left behind under it made the next watcher given that number fail to register, deaf
    # to its attempt's end (a CI run waited 30 s for an end it never heard).
    def _register(self, w: _Watch) -> None:
        if w.ended:
            return
        try:
            fd = w.chan.fileno()
            stale = self._sel.get_map().get(fd)
            if stale is not None:  # a closed channel's, under a number now this one's
                self._sel.unregister(fd)
            self._sel.register(fd, selectors.EVENT_READ, w)
            w.fd = fd
        except (KeyError, ValueError, OSError):
            pass
        self._read(w)  # what arrived before registration

    def _unregister(self, w: _Watch) -> None:
        fd, w.fd = w.fd, None
        key = None if fd is None else self._sel.get_map().get(fd)
        if key is not None and key.data is w:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(fd)

    def _drop(self, w: _Watch) -> None:
        w.ended = True
        self._call(lambda: self._release(w))

    def _release(self, w: _Watch) -> None:
        """Out of the selector, then closed (on the selector's thread, in that order)."""
        self._unregister(w)
        with contextlib.suppress(Exception):
            w.chan.close()

    def _serve(self) -> None:
        swept = time.monotonic()
        while True:
            with self._lock:
                if self._stopped:
                    return
            try:
                events = self._sel.select(timeout=SWEEP_EVERY)
            except (OSError, ValueError):
                return
            for key, _ in events:
                if key.data is None:
                    self._run_pending()
                else:
                    self._read_or_let_go(key.data)
            if time.monotonic() - swept >= SWEEP_EVERY:
                swept = time.monotonic()
                self._sweep()

    def _read_or_let_go(self, w: _Watch) -> None:
        """`_read`, and a watch whose read fails for a reason it does not expect (a bug) is
        let go as if its channel closed: logged once, its job told (the next probe re-arms
        it), and out of the selector, which would otherwise wake for it at once, forever.
        The thread that serves every other watcher goes on."""
        try:
            self._read(w)
        except Exception:
            log.exception("%s: watcher of %s failed; letting it go", w.label, w.key[0])
            self._end(w)

    def _run_pending(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        with self._lock:
            pending, self._pending = self._pending, []
        for fn in pending:
            try:
                fn()
            except Exception:  # one failed registration or release must not drop the rest
                log.exception("ssh watchers: a queued step failed")

    def _sweep(self) -> None:
        """Read every registered watch with input pending. A channel's descriptor is
        paramiko's pipe, set and cleared by two threads with no lock between its stdout and
        stderr halves (paramiko/paramiko#1235, open upstream): a set racing a clear can leave
        data or the end pending with the pipe empty, and the selector deaf to that channel
        until its next input, which after an end never comes. The sweep bounds such a loss
        to SWEEP_EVERY (a watch the selector did wake for is read again: nothing new)."""
        for key in list(self._sel.get_map().values()):
            w = key.data
            if w is None:
                continue
            chan = w.chan
            if chan.closed or chan.eof_received or chan.recv_ready() or chan.recv_stderr_ready():
                self._read_or_let_go(w)

    def _read(self, w: _Watch) -> None:
        chan = w.chan
        try:
            while chan.recv_stderr_ready():
                w.control += chan.recv_stderr(4096)
            while chan.recv_ready():
                with self._lock:
                    full = len(w.buf) >= BUFFER_MAX
                    if full:
                        w.paused = True
                if full:
                    self._unregister(w)
                    return
                data = chan.recv(1 << 16)
                with self._lock:
                    w.buf += data
            closed = chan.closed or chan.eof_received or not chan.get_transport().is_active()  # type: ignore[union-attr]
        except (OSError, EOFError, AttributeError):
            closed = True
        if closed:
            self._end(w)

    def _end(self, w: _Watch) -> None:
        """Its channel closed (or its read failed): out of the selector and the table, the
        channel closed, and its job told once, unless it was dropped on purpose."""
        self._unregister(w)
        with self._lock:
            if w.ended:  # dropped or forgotten on purpose: nobody needs to hear it
                return
            w.ended = True
            w.finished = scripts.WATCH_MAGIC + b" ended" in w.control
            legacy = scripts.WATCH_MAGIC + b" legacy" in w.control
            if self._watches.get(w.key) is w:
                del self._watches[w.key]
            if legacy:
                if len(self._legacy) > 10_000:
                    self._legacy.clear()
                self._legacy.add(w.key)
        with contextlib.suppress(Exception):
            w.chan.close()
        if legacy:
            return  # never watchable: the probe keeps polling it, and a wake-up would loop
        log.debug("%s: watcher of %s closed (%s)", w.label, w.key[0],
                  "attempt ended" if w.finished else "connection or host lost")
        for fn in self.on_change:
            try:
                fn(w.key[0])
            except Exception:  # a listener's bug must not stop the other watchers
                log.exception("watcher listener failed")

    def legacy(self, key: Key) -> bool:
        """This attempt cannot be watched on this host (started without the lock)."""
        with self._lock:
            return key in self._legacy


def _peer_closed(chan: paramiko.Channel) -> bool:
    """Has the connection under `chan` ended, even if paramiko's reader has not acted on it
    yet? The kernel's TCP state says so the moment the peer's FIN or RST arrived (whoever
    read it): a probe answered from a watcher never reports a closed host as running."""
    if chan.closed:
        return True
    t = chan.get_transport()
    if t is None or not t.is_active():
        return True
    sock = getattr(t, "sock", None)
    if not isinstance(sock, socket.socket):
        return False
    try:
        if hasattr(socket, "TCP_INFO"):
            return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != _TCP_ESTABLISHED
        peek = select.poll()  # not select(): descriptors past 1,024 are usual with a thousand hosts
        peek.register(sock, select.POLLIN)
        if not peek.poll(0):
            return False  # nothing pending: not even an end
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError, TimeoutError):
        return False  # paramiko's reader took what was there first
    except OSError:
        return True


_TCP_ESTABLISHED = 1  # tcpi_state, the first byte of Linux's struct tcp_info
