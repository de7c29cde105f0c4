"""The watch loop: wake on a ref change (watchdog) or every `interval` seconds, then ingest.

The file system event is only a hint: refs are written by lock-and-rename, may be packed
(`packed-refs`) or live in a reftable, so after any event the branch is re-read with git.
The poll is the backstop for everything a hint can miss (network file systems, a remote
mirror that only changes when fetched).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ledger import defaults
from ledger.forge.reviews import ReviewLookup
from ledger.forge.webflow import WebFlowKeys
from ledger.gitops.ingest import IngestReport, ingest
from ledger.gitops.mirror import ensure_mirror, fetch_mirror, is_remote
from ledger.gitops.repo import GitRepo
from ledger.store import Store

if TYPE_CHECKING:
    from watchdog.events import FileSystemEvent
    from watchdog.observers.api import BaseObserver

log = logging.getLogger("tpu_ledger.watch")


class Watcher:
    """Keeps the ledger in step with `branch` of `source` (a local path or a remote URL).

    `run()` blocks until `stop()`; `run_once()` is one fetch + ingest. `on_report` is called
    after each ingest that appended something or paused; `on_error` with each failure
    (the loop never dies of one: a bad file becomes `rejected`, a commit that cannot be
    ingested at all `quarantined`, and a git or store error is reported and retried with
    exponential backoff up to WATCH_MAX_BACKOFF_S).
    """

    def __init__(
        self,
        source: str,
        store: Store,
        branch: str = "main",
        *,
        interval: float = 5.0,
        cache_dir: Path | None = None,
        use_watchdog: bool = True,
        accept_rewrite: bool = False,
        accepted_by: str = "operator",
        on_report: Callable[[IngestReport], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
        web_flow: WebFlowKeys | None = None,
        reviews: ReviewLookup | None = None,
    ) -> None:
        self.source = source
        self.store = store
        self.branch = branch
        self.interval = interval
        self.remote = is_remote(source)
        self.path = ensure_mirror(source, cache_dir) if self.remote else Path(source)
        self.repo = GitRepo(self.path)
        self.use_watchdog = use_watchdog and not self.remote
        self.accept_rewrite = accept_rewrite
        self.accepted_by = accepted_by
        self.on_report = on_report
        self.web_flow = web_flow  # GitHub's keys for the merges it signs (None: LEDGER_WEB_FLOW_KEYS or shipped)
        self.reviews = reviews  # a forge's pull request reviews (ledger.forge), if any
        self.on_error = on_error or (lambda exc: log.warning("ingest failed: %s; retrying with backoff", exc))
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.wakeups = 0  # file system hints received (tests and the benchmark read it)
        self.backoff = 0.0  # seconds waited after the last failure (0 when the last run worked)
        self.last_success: float | None = None  # when an ingest last ran through (Unix time; metrics, /readyz)
        self.errors = 0  # ingests that failed (metrics)

    # -- control --------------------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run_once(self) -> IngestReport:
        if self.remote:
            fetch_mirror(self.repo)
        report = ingest(
            self.repo, self.store, self.branch,
            accept_rewrite=self.accept_rewrite, accepted_by=self.accepted_by,
            web_flow=self.web_flow, reviews=self.reviews,
        )
        if report.paused:
            self.accept_rewrite = False  # an acceptance covers the rewrite seen at the time only
        return report

    def run(self) -> None:
        observer = self._start_observer() if self.use_watchdog else None
        was_paused = False
        failures = 0
        last_error = ""
        try:
            while not self._stop.is_set():
                self._wake.clear()  # before reading the ref: a later change wakes us again
                try:
                    report = self.run_once()
                except Exception as exc:  # noqa: BLE001 - the loop must outlive any surprise
                    # git or the store failed (a commit's own content is quarantined by
                    # ingest): retry with exponential backoff, hints ignored meanwhile, and
                    # report an error when it changes or at each doubling, never per retry.
                    failures += 1
                    self.errors += 1
                    text = f"{type(exc).__name__}: {exc}"
                    if text != last_error or failures & (failures - 1) == 0:
                        self.on_error(exc)
                    last_error = text
                    self.backoff = min(defaults.WATCH_MAX_BACKOFF_S, self.interval * 2 ** min(failures - 1, 16))
                    self._stop.wait(self.backoff)
                    continue
                failures, last_error, self.backoff = 0, "", 0.0
                self.last_success = time.time()
                self.accept_rewrite = False
                # a pause is reported when it starts, not again at every poll
                news = report.commits or (report.paused and not was_paused)
                was_paused = report.paused
                if self.on_report and news:
                    self.on_report(report)
                self._wake.wait(self.interval)
        finally:
            if observer is not None:
                observer.stop()
                observer.join(timeout=5)
            self.repo.close()

    # -- hints ----------------------------------------------------------------------------
    def _start_observer(self) -> BaseObserver:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class _Hint(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                path = str(getattr(event, "dest_path", "") or event.src_path)
                if "/objects" in path:  # object writes precede the ref update; wait for that
                    return
                watcher.wakeups += 1
                watcher._wake.set()

        git_dir = self.repo.git_dir
        observer = Observer()
        handler = _Hint()
        # packed-refs, HEAD and friends sit directly in the git dir; loose refs below refs/.
        observer.schedule(handler, str(git_dir), recursive=False)
        for sub in ("refs", "reftable"):
            if (git_dir / sub).is_dir():
                observer.schedule(handler, str(git_dir / sub), recursive=True)
        observer.daemon = True
        observer.start()
        return observer
