"""The collector: every log file the reconciler fetched into its log directory, copied into
the shared archive as it grows (bounded by `bounds`), so `ledger logs` and the dashboard
show any attempt from any host, after a takeover too.

A pass walks the local log directory, compares each file's size with what the archive
holds (known from one listing of the archive at the first pass, then kept up to date), and
ships what is new.
Everything collected goes through `Collector.ship`, the one path from a local log to the
shared place. A failed write (the archive unreachable) is logged and retried at the next
pass; an append refused because another collector extended the file first refreshes that
job's sizes from the archive. Collecting never stops the reconciler.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from reconciler.joblogs.archive import LogArchive
from reconciler.joblogs.bounds import Limits, marker, next_shipment

log = logging.getLogger("tpu_ledger.joblogs")

STATUS_PREFIX = "status_"  # a worker's final state, replaced whole
MAX_STATUS = 64 << 10


def _collectable(name: str) -> bool:
    return name.endswith(".log") or (name.startswith(STATUS_PREFIX) and name.endswith(".json"))


def job_of(key: str) -> str:
    """The job part of a key `<job>/<attempt>/<file>`."""
    return key.rsplit("/", 2)[0]


class Collector:
    def __init__(self, log_dir: Path, archive: LogArchive, limits: Limits | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.archive = archive
        self.limits = limits or Limits()
        self._stored: dict[str, dict[str, int]] | None = None  # job -> key -> collected size
        self._settled: dict[str, int] = {}  # attempt folder -> its mtime when found settled
        self._attempts: dict[str, int] = {}
        self._failed = False

    def _sizes(self, job: str, *, refresh: bool = False) -> dict[str, int]:
        if self._stored is None:  # the first pass: one listing of the whole archive
            self._stored = {}
            for key, size in self.archive.sizes("").items():
                self._stored.setdefault(job_of(key), {})[key] = size
        if refresh:
            self._stored[job] = self.archive.sizes(f"{job}/")
        return self._stored.setdefault(job, {})

    def local_files(self) -> list[tuple[str, Path, int]]:
        """(key, path, size) of every collectable file under the log directory, but those of
        attempts that are settled (below) and whose folder has not changed since."""
        found: list[tuple[str, Path, int]] = []
        self._attempts: dict[str, int] = {}  # attempt folder (rel) -> its mtime, as walked now
        self._walk(str(self.log_dir), "", found)
        # A worker's status last: once it is collected, so is the output it ends.
        return sorted(found, key=lambda item: item[0].rsplit("/", 1)[1].startswith(STATUS_PREFIX))

    def _walk(self, folder: str, rel: str, found: list[tuple[str, Path, int]]) -> None:
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError):
            return
        attempt = bool(rel) and rel.rsplit("/", 1)[-1].isdigit()  # files live in <job>/<attempt>/
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    sub = f"{rel}/{entry.name}" if rel else entry.name
                    if rel and entry.name.isdigit():
                        mtime = entry.stat(follow_symlinks=False).st_mtime_ns
                        if self._settled.get(sub) == mtime:
                            continue
                        self._attempts[sub] = mtime
                    self._walk(entry.path, sub, found)
                elif attempt and _collectable(entry.name):
                    found.append((f"{rel}/{entry.name}", Path(entry.path), entry.stat(follow_symlinks=False).st_size))
            except FileNotFoundError:
                continue

    def _settle(self, files: list[tuple[str, Path, int]]) -> None:
        """Remember the attempts that are over and wholly collected (each worker's output has
        its final status, and nothing is left to collect): later passes skip them until their
        folder changes (a file is created or replaced in it). A reconciler with many past jobs
        then walks only the attempts under way."""
        by_attempt: dict[str, list[tuple[str, int]]] = {}
        for key, _, size in files:
            by_attempt.setdefault(key.rsplit("/", 1)[0], []).append((key, size))
        for folder, entries in by_attempt.items():
            names = {key.rsplit("/", 1)[1] for key, _ in entries}
            outputs = {n.removeprefix("output_").removesuffix(".log") for n in names if n.startswith("output_")}
            statuses = {n.removeprefix(STATUS_PREFIX).removesuffix(".json") for n in names if n.startswith(STATUS_PREFIX)}
            if not statuses or not outputs <= statuses or folder not in self._attempts:
                continue
            stored = self._sizes(job_of(entries[0][0]))
            total = sum(stored.values())
            if all(stored.get(key) == size if key.rsplit("/", 1)[1].startswith(STATUS_PREFIX)
                   else next_shipment(size, stored.get(key, 0), total, self.limits) is None for key, size in entries):
                self._settled[folder] = self._attempts[folder]

    def run_pass(self) -> int:
        """One pass over the log directory; returns the bytes collected."""
        shipped = 0
        files = self.local_files()
        for key, path, size in files:
            try:
                shipped += self.ship(key, path, size)
            except Exception as exc:  # the archive is a remote service: report, retry next pass
                if not self._failed:
                    log.warning("collecting job logs into %s failed: %s (retried every pass)", self.archive.where, exc)
                self._failed = True
                self._stored = None  # measured again once it answers
                return shipped
        if self._failed:
            log.info("collecting job logs into %s works again", self.archive.where)
            self._failed = False
        self._settle(files)
        return shipped

    def ship(self, key: str, path: Path, size: int) -> int:
        """Collect what is new of one local file: the only way output reaches the archive."""
        job = job_of(key)
        stored = self._sizes(job)
        name = key.rsplit("/", 1)[1]
        if name.startswith(STATUS_PREFIX):
            if stored.get(key) == size or size > MAX_STATUS:
                return 0
            data = path.read_bytes()
            self.archive.put(key, data)
            stored[key] = len(data)
            return len(data)
        shipment = next_shipment(size, stored.get(key, 0), sum(stored.values()), self.limits)
        if shipment is None:
            return 0
        with open(path, "rb") as f:
            f.seek(shipment.start)
            data = f.read(shipment.end - shipment.start)
        if shipment.cut:
            data += marker(self.limits)
        if not self.archive.append(key, shipment.start, data):
            self._sizes(job, refresh=True)  # another collector was first: measure again
            return 0
        stored[key] = shipment.start + len(data)
        return len(data)


class CollectorThread:
    """A pass every `every` seconds beside `ledger reconcile`, and a last one at `close()`."""

    def __init__(self, collector: Collector, every: float) -> None:
        self.collector = collector
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-collector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.collector.run_pass()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.collector.run_pass()  # what the last probes fetched
