"""The dashboard served for real: a uvicorn server in the test process over a real SQLite
ledger, and (for the browser tests) headless Chromium driven by Selenium through the
system's chromedriver, and a ledger made by the demo's story (the real watcher and
reconciler on the TPU emulator)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from ledger.app.dashboard.live import LiveLedger
from ledger.app.dashboard.server import Background, create_app, hosts_for
from ledger.app.demo import DemoResult, run_demo, start_dashboard

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@contextlib.contextmanager
def serve(store_url: str, log_dir: Path | None = None, *, verify_every: float = 600.0) -> Iterator[Background]:
    """A dashboard over `store_url` on a free loopback port, stopped at the end."""
    live = LiveLedger(store_url, verify_every=verify_every)
    app = create_app(live, store_label=store_url, log_dir=log_dir, allowed_hosts=hosts_for("127.0.0.1"))
    with Background(app) as server:
        yield server


@dataclass
class Story:
    """The demo's story (`ledger demo --dashboard`): the dashboard is up over the empty
    ledger first; `begin` starts the story in a thread, `finish` waits for its result."""

    workdir: Path
    site: Background
    thread: threading.Thread | None = None
    result: DemoResult | None = None
    error: BaseException | None = None

    def begin(self) -> None:
        def run() -> None:
            try:
                self.result = run_demo(self.workdir, pubsub=False, say=lambda _: None, timeout=150)
            except BaseException as exc:  # handed to the test in finish()
                self.error = exc

        self.thread = threading.Thread(target=run, name="demo-story", daemon=True)
        self.thread.start()

    def finish(self) -> DemoResult:
        if self.thread is None:
            self.begin()
        assert self.thread is not None
        self.thread.join(200)
        if self.error is not None:
            raise self.error
        assert self.result is not None and self.result.ok, self.result
        return self.result


@pytest.fixture(scope="module")
def demo_story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    """The dashboard `ledger demo --dashboard` serves, over the story of the demo: a hub, a
    reviewed pod job, a preemption midway, a recovery on a new TPU (the real watcher and
    reconciler on the TPU emulator)."""
    workdir = tmp_path_factory.mktemp("demo")
    story = Story(workdir, start_dashboard(workdir))
    try:
        yield story
    finally:
        if story.thread is not None:
            story.thread.join(200)
        story.site.stop()


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's chromium + chromium-driver; scripts/test-services.sh
    installs them), with a fresh profile and nothing that reaches the network by itself."""
    if not CHROMIUM or not Path(CHROMEDRIVER).exists():
        pytest.skip("chromium and chromium-driver are not installed (scripts/test-services.sh installs them)")
    profile = Path(tempfile.mkdtemp(prefix="dashboard-chromium-"))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1280,1400",
                "--hide-scrollbars", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP violations land there
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
