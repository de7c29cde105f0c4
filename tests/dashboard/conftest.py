"""The dashboard served for real: a uvicorn server in the test process over a real SQLite
ledger, and (for the browser tests) headless Chromium driven by Selenium through the
system's chromedriver, and a ledger made by the demo's story (the real watcher and
reconciler on the TPU emulator)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from ledger.app.dashboard.live import LiveLedger
from ledger.app.dashboard.server import Background, create_app, hosts_for
from ledger.app.demo import run_demo

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@contextlib.contextmanager
def serve(store_url: str, log_dir: Path | None = None, *, verify_every: float = 600.0) -> Iterator[Background]:
    """A dashboard over `store_url` on a free loopback port, stopped at the end."""
    live = LiveLedger(store_url, verify_every=verify_every)
    app = create_app(live, store_label=store_url, log_dir=log_dir, allowed_hosts=hosts_for("127.0.0.1"))
    with Background(app) as server:
        yield server


@pytest.fixture(scope="module")
def demo_ledger(tmp_path_factory: pytest.TempPathFactory):
    """The demo's whole story, once per module: a hub, a reviewed pod job, a preemption, a
    recovery; the ledger it leaves (ledger.db) and the logs the reconciler fetched."""
    workdir = tmp_path_factory.mktemp("demo")
    result = run_demo(workdir, pubsub=False, say=lambda _: None, timeout=150)
    assert result.ok, result.problems
    return result


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
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
