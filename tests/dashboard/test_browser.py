"""Every page of the dashboard in headless Chromium, over the ledger the demo's story leaves:
the real watcher and reconciler on the TPU emulator, a reviewed pod job preempted midway and
resumed on a new TPU. Screenshots of each page go to the test's tmp dir."""

from __future__ import annotations

from pathlib import Path

from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

from ledger.app.demo import JOB_ID, SNEAKY_ID
from ledger.events import NewEvent, actor
from ledger.store import open_store

WAIT_S = 20  # generous: a hang fails, a slow shared machine does not


def shoot(browser, tmp_path: Path, name: str) -> Path:
    """A screenshot of the whole page (the window grown to the document's height)."""
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, max(800, min(int(height) + 40, 6000)))
    path = tmp_path / f"{name}.png"
    assert browser.save_screenshot(str(path)) and path.stat().st_size > 10_000
    browser.set_window_size(1280, 1400)
    return path


def text(browser, css: str) -> str:
    return browser.find_element(By.CSS_SELECTOR, css).text


def no_console_errors(browser) -> None:
    """A Content-Security-Policy violation or a script error shows up here."""
    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def waiting(browser, seconds: float = WAIT_S) -> WebDriverWait:
    # The live parts of a page are swapped as events arrive: an element found a moment ago
    # may be gone; look again.
    return WebDriverWait(browser, seconds, ignored_exceptions=(StaleElementReferenceException,))


def job_rows_link(browser) -> str:
    return waiting(browser).until(lambda b: b.find_element(By.LINK_TEXT, JOB_ID).get_attribute("pathname"))


def job_rows(browser) -> dict[str, str]:
    return {r.get_attribute("data-job"): r.text for r in browser.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")}


def test_the_story_live_then_every_page(demo_story, browser, tmp_path):
    site, wait = demo_story.site, waiting(browser)
    long_wait = waiting(browser, 150)

    # the jobs page of an empty ledger, open while the story begins: jobs appear without a reload
    browser.get(f"{site.url}/jobs")
    assert job_rows(browser) == {None: "No job matches."}
    wait.until(lambda b: b.find_element(By.ID, "live-status").text == "live")
    browser.execute_script("window.stillThisPage = true")  # a reload would forget it
    demo_story.begin()
    long_wait.until(lambda b: JOB_ID in job_rows(b))
    assert browser.execute_script("return window.stillThisPage") is True

    # the job's page, open while it runs: the preemption and the finish arrive live
    browser.get(f"{site.url}{job_rows_link(browser)}")
    wait.until(lambda b: b.find_element(By.ID, "live-status").text == "live")
    browser.execute_script("window.stillThisPage = true")
    long_wait.until(lambda b: b.find_element(By.ID, "job-state").text == "finished")
    assert browser.execute_script("return window.stillThisPage") is True
    demo_story.finish()

    # one job: its attempts, the preemption segment, who, events and chain, the log
    browser.refresh()
    rows = [g.get_attribute("data-row") for g in browser.find_elements(By.CSS_SELECTOR, "svg.timeline g.row")]
    assert rows == ["attempt 1", "attempt 2"]
    preempted = browser.find_element(By.CSS_SELECTOR, 'svg.timeline g.row[data-row="attempt 1"] rect[data-kind="preempted"]')
    assert preempted.get_attribute("aria-label").startswith("attempt 1: preempted from ")
    assert float(preempted.get_attribute("width")) >= 5 and preempted.is_displayed()
    second = [r.get_attribute("data-kind") for r in
              browser.find_elements(By.CSS_SELECTOR, 'svg.timeline g.row[data-row="attempt 2"] rect')]
    assert "recovering" in second and "running" in second
    marks = {m.get_attribute("data-type") for m in browser.find_elements(By.CSS_SELECTOR, "svg.timeline g.mark")}
    assert {"preempted", "resumed", "finished"} <= marks
    assert "Sam Steward" in text(browser, "dl.who") and "pull request #1" in text(browser, "dl.who")
    events = text(browser, "#events")
    assert "preempted" in events and "resumed" in events and "action_intent" in events
    assert "training done" in text(browser, "#log") and "attempt 2" in text(browser, "#log-h")
    shoot(browser, tmp_path, "job")

    # jobs: both of the demo's jobs, then filtered by state with the form
    browser.get(f"{site.url}/jobs")
    rows = job_rows(browser)
    assert set(rows) == {JOB_ID, SNEAKY_ID}
    assert "finished" in rows[JOB_ID] and "v4-32" in rows[JOB_ID] and "rejected" in rows[SNEAKY_ID]
    shoot(browser, tmp_path, "jobs")
    Select(browser.find_element(By.NAME, "state")).select_by_value("finished")
    browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
    wait.until(lambda b: "state=finished" in b.current_url)
    assert list(job_rows(browser)) == [JOB_ID]

    # TPUs: everything was released at the end of the story
    browser.get(f"{site.url}/tpus")
    assert "No TPU is held right now." in text(browser, "main")
    shoot(browser, tmp_path, "tpus")

    # usage: alice's bar, goodput, one preemption; the week's column
    browser.get(f"{site.url}/usage")
    bar = browser.find_element(By.CSS_SELECTOR, '#owner-chart g.bar[data-owner="alice"]')
    assert "goodput" in bar.get_attribute("aria-label") and "1 preemption(s)" in bar.get_attribute("aria-label")
    assert browser.find_elements(By.CSS_SELECTOR, "#week-chart g.column")
    assert "alice" in text(browser, "#usage-table")
    shoot(browser, tmp_path, "usage")

    # health: the head, and a sound chain once verify ran over the whole story
    store = open_store(demo_story.result.store_url, create=False)
    try:
        head = store.head()
    finally:
        store.close()
    browser.get(f"{site.url}/health")
    assert f"seq {head}" in text(browser, "#health-head")
    wait.until(lambda b: (b.refresh() or True) and f"up to seq {head}" in text(b, "#verify"))
    assert "sound" in text(browser, "#verify")
    shoot(browser, tmp_path, "health")
    no_console_errors(browser)
    browser.get("about:blank")  # closes the page's event stream


def test_a_new_event_appears_live_without_a_reload(demo_story, browser, tmp_path):
    result = demo_story.finish()
    site = demo_story.site
    owner, name = JOB_ID.split("/")
    browser.get(f"{site.url}/jobs/{owner}/{name}")
    wait = waiting(browser)
    wait.until(lambda b: b.find_element(By.ID, "live-status").text == "live")
    before = len(browser.find_elements(By.CSS_SELECTOR, "#events tbody tr"))
    browser.execute_script("window.stillThisPage = true")  # a reload would forget it
    store = open_store(result.store_url, create=False)
    try:
        store.append(JOB_ID, [NewEvent("note", {"text": "seen live in the browser"}, actor("cli", "tester"))])
    finally:
        store.close()
    wait.until(lambda b: "seen live in the browser" in b.find_element(By.ID, "events").text)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#events tbody tr")) == before + 1
    assert browser.execute_script("return window.stillThisPage") is True
    assert browser.find_elements(By.CSS_SELECTOR, 'svg.timeline g.mark[data-type="note"]')
    shoot(browser, tmp_path, "job-live")

    # the queue, reached from the nav: empty after the story; a job submitted now (the demo's
    # reconciler has stopped, so nobody gives it a TPU) appears in it live, with why it waits
    browser.find_element(By.CSS_SELECTOR, 'nav a[href="/queue"]').click()
    wait.until(lambda b: b.find_element(By.ID, "live-status").text == "live")
    assert "No job is waiting." in text(browser, "main")
    browser.execute_script("window.stillThisPage = true")
    spec = {"tpu": {"accelerator": "v4-8", "zone": "us-central2-b", "pricing": "spot"}, "command": {"cmd": "true"}}
    store = open_store(result.store_url, create=False)
    try:
        store.append("dave/late", [NewEvent("submitted", {"spec": spec, "spec_hash": "ab" * 32, "commit": "c0ffee",
                                                          "path": "jobs/dave/late.yaml"}, actor("git", "tester"))])
    finally:
        store.close()
    row = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, '#queue tr[data-job="dave/late"]'))
    assert row.get_attribute("data-wait") == "admitted" and "4 v4" in row.text and "next pass" in row.text
    assert browser.execute_script("return window.stillThisPage") is True
    shoot(browser, tmp_path, "queue")
    no_console_errors(browser)
    browser.get("about:blank")
