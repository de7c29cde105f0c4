"""A service's heartbeat: a row in the store, refreshed every `defaults.HEARTBEAT_EVERY_S`
on a connection of its own (ledger/store/heartbeats.py). A store that cannot be reached is
retried at the next beat: the heartbeat never stops the service."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from ledger import __version__, defaults
from ledger.store import open_heartbeats
from ledger.store.heartbeats import Beat, Heartbeats

log = logging.getLogger("tpu_ledger.heartbeat")


def instance_id(component: str) -> str:
    return f"{component}@{socket.gethostname()}:{os.getpid()}"


class HeartbeatThread:
    def __init__(self, store_url: str, component: str, *, lease_held: Callable[[], bool | None] | None = None,
                 every: float = defaults.HEARTBEAT_EVERY_S) -> None:
        self.store_url = store_url
        self.lease_held = lease_held or (lambda: None)
        self.every = every
        self.beat_of = Beat(instance=instance_id(component), component=component, host=socket.gethostname(),
                            pid=os.getpid(), version=__version__, started=time.time())
        self.beats = 0  # beats written (tests wait on it)
        self._stop = threading.Event()
        self._heartbeats: Heartbeats | None = None
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{component}", daemon=True)
        self._forgot = False

    @property
    def instance(self) -> str:
        return self.beat_of.instance

    def start(self) -> HeartbeatThread:
        # The first beat is written before start returns, so a service that answers /readyz
        # is already listed by `ledger status`.
        self.beat()
        self._thread.start()
        return self

    def beat(self) -> bool:
        """One beat now; False when the store could not be reached."""
        try:
            if self._heartbeats is None:
                self._heartbeats = open_heartbeats(self.store_url, create=False)
            if not self._forgot:
                self._heartbeats.forget(defaults.HEARTBEAT_FORGET_S)
                self._forgot = True
            beat = self.beat_of
            held = self.lease_held()
            self._heartbeats.beat(Beat(beat.instance, beat.component, beat.host, beat.pid, beat.version, beat.started, held))
        except Exception as exc:  # the store is down: the next beat tries again
            log.warning("heartbeat of %s not written: %s", self.instance, str(exc).splitlines()[0] if str(exc) else exc)
            self._drop()
            return False
        self.beats += 1
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.beat()

    def _drop(self) -> None:
        if self._heartbeats is not None:
            try:
                self._heartbeats.close()
            except Exception as exc:
                log.debug("closing heartbeats: %s", exc)
            self._heartbeats = None

    def close(self) -> None:
        """Stop beating and record a clean stop (`ledger status` then says stopped, not dead)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        try:
            if self._heartbeats is None:
                self._heartbeats = open_heartbeats(self.store_url, create=False)
            self._heartbeats.stop(self.instance)
        except Exception as exc:
            log.warning("could not record that %s stopped: %s", self.instance, exc)
        self._drop()
