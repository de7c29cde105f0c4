"""The dashboard's queue (`/queue`, `/api/queue`) over a real SQLite ledger whose sharing
rules are recorded: the rows are `ledger queue --json`'s, and the live fair-share meter,
built at the first visit and fed by the tail after, gives the figures a fresh fold of the
whole ledger gives. And the TPUs page's health column, kept current by the same tail."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.app.cli import cli
from ledger.app.dashboard import live as live_module
from ledger.app.dashboard import views
from ledger.app.dashboard.live import LiveLedger
from ledger.app.dashboard.server import Background, create_app, hosts_for
from ledger.app.queueview import recent_usage, record_policy
from ledger.events import NewEvent, actor
from ledger.replay import tied_snapshot
from ledger.store import open_store
from ledger.usage import from_us
from ledger.usage.snapshot import code_version, encode, load_usage, save_usage, snapshot_name
from tests.admission.lab import policy
from tests.admission.test_queue_cli import GIT, running, spec
from tests.dashboard.conftest import serve
from tests.dashboard.test_http import get, get_json


def append(store, job_id: str, events: list[tuple[str, dict]]) -> None:
    store.append(job_id, [NewEvent(t, {**(GIT if t == "submitted" else {}), **d}, actor("git", "tester")) for t, d in events])


@pytest.fixture
def lab(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    store = open_store(url)
    append(store, "alice/a", running("v4-128", "n1"))  # alice holds 64 of her 64 v4 chips
    append(store, "alice/b", [("submitted", {"spec": spec("v4-64")})])
    append(store, "carol/c", [("submitted", {"spec": spec("v4-8", priority=900)})])
    record_policy(store, policy(), source="test", holder="test")
    yield url, store
    store.close()


def without_usage(rows: list[dict]) -> list[dict]:
    """The rows but their fair-share figure, which grows with the clock while alice/a runs."""
    return [{k: v for k, v in r.items() if k != "fair_share_usage"} for r in rows]


def test_the_queue_page_and_api_answer_as_ledger_queue(lab):
    url, _ = lab
    with serve(url) as site:
        api = get_json(site.url, "/api/queue")
        tree = get_json(site.url, "/api/queue/tree")
        status, _, page = get(site.url, "/queue")
    cli_rows = json.loads(CliRunner().invoke(cli, ["--store", url, "queue", "--json"]).output)
    assert without_usage(api) == without_usage(cli_rows)
    assert [(r["job"], r["wait"]) for r in api] == [("carol/c", "admitted"), ("alice/b", "quota")]
    assert status == 200 and 'data-job="alice/b" data-wait="quota"' in page
    assert "user alice holds 64 of 64 v4 chips, needs 32" in page and 'aria-current="page">Queue' in page
    # the fair tree: `ledger queue --tree --json`'s levels, shown under the queue
    cli_tree = json.loads(CliRunner().invoke(cli, ["--store", url, "queue", "--tree", "--json"]).output)
    assert [(lv["level"], lv["name"], lv["parent"]) for lv in tree] == [(lv["level"], lv["name"], lv["parent"]) for lv in cli_tree]
    assert [(lv["level"], lv["name"]) for lv in tree] == [
        ("lab", "lab"), ("team", "(no team)"), ("user", "carol"), ("team", "@lab/nlp"), ("user", "alice")]
    assert 'data-level="team" data-name="@lab/nlp"' in page and 'id="fair-tree"' in page


def test_the_live_meter_keeps_up_with_the_tail(lab):
    url, store = lab
    rules = policy()
    live = LiveLedger(url)
    try:
        now = live.now_us()
        assert live.recent_usage(rules, store, now).decayed == pytest.approx(recent_usage(store, rules, from_us(now)).decayed)
        assert live.meter is not None
        # alice/a ends (its interval closes: fed to the meter by the tail, not a new fold)
        append(store, "alice/a", [("finished", {"exit_code": 0})])
        append(store, "bob/d", running("v4-8", "n2"))
        live.fold(list(store.fold_rows(live.position, None)))
        later = live.now_us()
        mine, fresh = live.recent_usage(rules, store, later), recent_usage(store, rules, from_us(later))
        assert mine.decayed == pytest.approx(fresh.decayed) and mine.week == pytest.approx(fresh.week)
        assert set(mine.decayed) == {"alice", "bob"} and mine.decayed["alice"] > 0
        assert [r["job"] for r in views.queue_page(live, store)["rows"]] == ["carol/c", "alice/b"]
    finally:
        live.close()


def test_the_queue_is_made_once_per_position_and_refresh_and_again_after_an_event(lab):
    url, store = lab
    live = LiveLedger(url)
    try:
        first = views.queue_page(live, store)
        assert views.queue_page(live, store) is first  # nothing happened: the same answer
        append(store, "bob/e", [("submitted", {"spec": spec("v4-8")})])
        live.fold(list(store.fold_rows(live.position, None)))
        after = views.queue_page(live, store)
        assert after is not first and "bob/e" in [r["job"] for r in after["rows"]]
    finally:
        live.close()


def test_the_tpus_page_shows_the_last_host_check_live(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    store = open_store(url)
    append(store, "alice/a", running("v4-8", "n1"))
    try:
        with serve(url) as site:
            assert get_json(site.url, "/api/tpus")[0]["health"] == ""  # never checked
            append(store, "alice/a", [("started", {"attempt": 1, "health": "warning"})])  # the tail folds it
            deadline = time.monotonic() + 20
            while get_json(site.url, "/api/tpus")[0]["health"] != "warning" and time.monotonic() < deadline:
                time.sleep(0.1)
            rows = get_json(site.url, "/api/tpus")
            status, _, page = get(site.url, "/tpus")
        assert rows == json.loads(CliRunner().invoke(cli, ["--store", url, "tpus", "--json"]).output)
        assert rows[0]["health"] == "warning" and rows[0]["checked"]
        assert status == 200 and 'class="state health-warning"' in page
    finally:
        store.close()


def test_the_queue_page_shows_a_page_of_rows_with_links_to_the_others_and_keeps_its_filters(lab):
    """A lab's 10,000 waiting jobs are read a page at a time: the page says how many there
    are, links to the previous and next pages with the filters kept, and /api/queue still
    answers every row."""
    import re

    url, store = lab
    for i in range(5):
        append(store, f"bob/w{i}", [("submitted", {"spec": spec("v4-8")})])
    with serve(url) as site:
        every = get_json(site.url, "/api/queue")
        assert len(every) == 7
        order = [r["job"] for r in every]

        def shown(path: str) -> tuple[int, list[str], str]:
            status, _, page = get(site.url, path)
            return status, re.findall(r'<tr data-job="([^"]+)"', page), page

        status, jobs, page = shown("/queue?per_page=3")
        assert status == 200 and jobs == order[:3]
        assert "7 job(s)" in page and "1–3 shown, page 1 of 3" in page
        assert 'rel="next" href="/queue?page=2&amp;per_page=3"' in page and 'rel="prev"' not in page
        status, jobs, page = shown("/queue?per_page=3&page=3")
        assert jobs == order[6:] and 'rel="prev" href="/queue?page=2&amp;per_page=3"' in page and 'rel="next"' not in page
        assert shown("/queue?per_page=3&page=99")[1] == order[6:]  # past the end: the last page
        # an owner's jobs, a page at a time, the filter kept in the links
        bobs = [j for j in order if j.startswith("bob/")]
        status, jobs, page = shown("/queue?owner=bob&per_page=2")
        assert jobs == bobs[:2] and "5 of them match" in page
        assert 'href="/queue?owner=bob&amp;page=2&amp;per_page=2"' in page
        assert shown("/queue?owner=bob&per_page=2&page=3")[1] == bobs[4:]
        # by what they wait for: each count in the heading links to its jobs
        waits = {r["wait"] for r in every}
        assert len(waits) > 1
        page = shown("/queue")[2]
        for wait in waits:
            assert f'href="/queue?wait={wait}"' in page
            assert shown(f"/queue?wait={wait}")[1] == [r["job"] for r in every if r["wait"] == wait]
        status, jobs, page = shown("/queue?owner=nobody")
        assert status == 200 and jobs == [] and "No waiting job matches." in page
        assert shown("/queue")[1] == order  # fewer than a page: all of them, no pager
        assert 'class="pager"' not in shown("/queue")[2]
        assert get(site.url, "/queue?page=x")[0] == 400
        # /api/queue pages the same way when asked to (a script polling a lab's 10,000 rows)
        paged = get_json(site.url, "/api/queue?owner=bob&per_page=2&page=2")
        assert paged["total"] == 5 and paged["pages"] == 3 and paged["page"] == 2 and paged["offset"] == 2
        assert paged["per_page"] == 2 and [r["job"] for r in paged["rows"]] == bobs[2:4]
        assert get(site.url, "/api/queue?page=x")[0] == 400


def test_a_large_ledger_is_served_while_its_usage_is_folded_behind_the_pages(lab, monkeypatch):
    """Past FOLD_BEHIND_FROM events the dashboard serves before usage is folded: the jobs
    pages at once; a page that reads usage waits for it, then answers 503 saying how far it
    is. Caught up (the rows the tail read meanwhile included), its usage is the usage of a
    dashboard that folded it at start."""
    url, store = lab
    held = threading.Event()
    catch_up = LiveLedger._catch_up

    def held_back(live: LiveLedger) -> None:
        held.wait(30)
        catch_up(live)

    monkeypatch.setattr(LiveLedger, "_catch_up", held_back)
    monkeypatch.setattr(live_module, "USAGE_WAIT_S", 0.2)
    behind = LiveLedger(url, fold_behind_from=1)
    with Background(create_app(behind, store_label=url, allowed_hosts=hosts_for("127.0.0.1"))) as site:
        status, headers, body = get(site.url, "/api/usage")
        assert status == 503 and headers["retry-after"] == "5"
        assert "usage is still being read from the ledger (0 of 9 events)" in json.loads(body)["error"]
        assert get(site.url, "/queue")[0] == 503
        status, headers, page = get(site.url, "/usage")  # a browser reloads it by itself
        assert status == 503 and headers["retry-after"] == "5" and '<meta http-equiv="refresh" content="5">' in page
        assert [j["id"] for j in get_json(site.url, "/api/jobs")["jobs"]] == ["alice/a", "alice/b", "carol/c"]
        health = get_json(site.url, "/api/health")
        assert (health["usage_ready"], health["usage_folded"], health["folded"]) == (False, 0, 9)
        assert "usage still being read: seq 0 of 9" in get(site.url, "/health")[2]
        append(store, "alice/a", [("finished", {"exit_code": 0})])  # read by the tail, kept for usage
        append(store, "bob/d", running("v4-8", "n2"))
        deadline = time.monotonic() + 30
        while behind.position < store.head() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert behind.position == store.head() and not behind.usage_ready.is_set()
        held.set()
        assert behind.usage_ready.wait(30)
        assert get_json(site.url, "/api/health")["usage_ready"] and "still being read" not in get(site.url, "/health")[2]
        at_start = LiveLedger(url)
        try:
            now = at_start.now_us()
            behind.now_us = at_start.now_us = lambda: now  # type: ignore[method-assign]
            assert views.usage_page(behind) == views.usage_page(at_start)
            assert behind.usage.figures(now) == at_start.usage.figures(now) and behind.usage.position == store.head()
            assert [r["job"] for r in views.queue_page(behind, store)["rows"]] == ["carol/c", "alice/b"]
        finally:
            at_start.close()


@pytest.mark.parametrize("behind", [False, True], ids=["at-start", "behind-the-pages"])
def test_usage_and_the_meter_start_from_the_usage_snapshot(lab, behind):
    """The dashboard takes usage and the fair-share meter from the recorded policy's usage
    snapshot and folds only the events after it, at start or behind the pages: what a fold
    from the first event gives, the weekly table included, and the meter ready for the first
    visit to the queue. That it read the snapshot shows when one is forged (hashes
    consistent: only `ledger verify` reads a snapshot against the events)."""
    url, store = lab
    half_life = policy().fair_share.half_life_hours
    save_usage(store, *load_usage(store, half_life), now=None)
    append(store, "alice/a", [("finished", {"exit_code": 0})])  # after the snapshot
    append(store, "bob/d", running("v4-8", "n2"))

    def started() -> LiveLedger:
        live = LiveLedger(url, fold_behind_from=1 if behind else live_module.FOLD_BEHIND_FROM)
        live.start()
        assert live.usage_ready.wait(30)
        return live

    live = started()
    try:
        meter, whole = load_usage(store, half_life, use_snapshot=False)
        now = live.now_us()
        assert live.usage.position == whole.position == store.head()
        assert live.usage.figures(now) == whole.figures(now) and live.usage.weeks == whole.weeks and whole.weeks
        assert live.meter is not None and live.meter.decayed(now) == meter.decayed(now)
    finally:
        live.close()
    meter, fold = load_usage(store, half_life, until=store.head() - 2)
    week, owner = next(iter(fold.weeks))
    fold.weeks[week, owner][3] += 3_600_000_000  # an hour of one chip running more
    store.save_snapshot(tied_snapshot(store, snapshot_name(half_life), code_version(), fold.position, encode(meter, fold)))
    live = started()
    try:
        assert live.usage.weeks[week, owner][3] == whole.weeks[week, owner][3] + 3_600_000_000
    finally:
        live.close()
