"""The dashboard as a service: /metrics, /healthz and /readyz on its own port, its heartbeat
on the health page, and /api/health answering 503 once verify found the ledger unsound."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ledger.app.dashboard.live import LiveLedger
from ledger.app.dashboard.observe import observe_dashboard
from ledger.app.dashboard.server import Background, create_app, hosts_for
from ledger.app.observability.service import Service
from ledger.events import NewEvent
from ledger.replay import load_state
from ledger.store.sqlite import SQLiteStore
from tests.dashboard.test_http import get
from tests.usage.ledger_by_hand import EVENTS


def _ledger(path: Path) -> str:
    store = SQLiteStore(path)
    for stream, type_, when, data in EVENTS:
        store.append(stream, [NewEvent(type_, data, time=when)])
    store.close()
    return f"sqlite:///{path}"


def test_metrics_readiness_heartbeats_and_a_failed_verify(tmp_path: Path) -> None:
    url = _ledger(tmp_path / "ledger.db")
    live = LiveLedger(url)
    service = observe_dashboard(Service("dashboard", url, None), live).start()
    app = create_app(live, store_label=url, allowed_hosts=hosts_for("127.0.0.1"), service=service)
    try:
        with Background(app) as site:
            deadline = time.monotonic() + 60
            while live.last_verify is None and time.monotonic() < deadline:  # the first verify runs at start
                time.sleep(0.05)
            status, headers, body = get(site.url, "/metrics")
            assert status == 200 and headers["content-type"].startswith("text/plain")
            found = {(s.name, tuple(sorted(s.labels.items()))): s.value
                     for f in text_string_to_metric_families(body) for s in f.samples}
            store = SQLiteStore(tmp_path / "ledger.db", create=False)
            jobs = load_state(store).jobs
            store.close()
            states: dict[str, int] = {}
            for job in jobs.values():
                states[job.state] = states.get(job.state, 0) + 1
            assert {dict(k[1])["state"]: v for k, v in found.items() if k[0] == "tpu_ledger_jobs"} == states
            assert found[("tpu_ledger_verify_ok", ())] == 1
            assert found[("tpu_ledger_build_info", (("component", "dashboard"), ("version", "0.1.0")))] == 1
            assert get(site.url, "/healthz")[0] == 200
            status, _, body = get(site.url, "/readyz")
            assert status == 200 and json.loads(body)["ready"] is True
            status, _, body = get(site.url, "/api/health")
            assert status == 200
            instances = json.loads(body)["instances"]
            assert [(i["component"], i["state"]) for i in instances] == [("dashboard", "alive")]
            status, _, page = get(site.url, "/health")
            assert status == 200 and service.heartbeat.instance in page

            # Someone rewrites an event under the guard: the next verify finds it.
            db = sqlite3.connect(tmp_path / "ledger.db")
            db.execute("DROP TRIGGER events_no_update")
            db.execute("UPDATE events SET data = ? WHERE seq = 2", ('{"altered":true}',))
            db.commit()
            db.close()
            live.verify_now()
            status, _, body = get(site.url, "/api/health")
            assert status == 503 and json.loads(body)["verify"]["report"]["ok"] is False
            status, _, body = get(site.url, "/readyz")
            answer = json.loads(body)
            assert status == 503 and answer["failed"] == ["verify"], answer
            assert "unsound at seq 2" in answer["checks"]["verify"]["detail"]
    finally:
        service.close()


def test_the_health_page_names_the_snapshot_replay_starts_from(tmp_path):
    """This code's newest job-state snapshot (its manifest, fetched alone: listing every
    snapshot fetched each whole at every visit, ~150 MB at 118,956 jobs)."""
    from ledger.app.dashboard import views
    from ledger.replay import save_snapshot
    from ledger.snapshots.jobs import code_version
    from ledger.store.base import Snapshot

    url = _ledger(tmp_path / "ledger.db")
    live = LiveLedger(url)
    store = SQLiteStore(tmp_path / "ledger.db")
    try:
        head = store.head()
        assert views.health_page(live, store, "here")["snapshot"] is None
        store.save_snapshot(Snapshot.seal("ledger", "other-code", head, store.hash_at(head), b"of another release"))
        assert views.health_page(live, store, "here")["snapshot"] is None  # replay would not use it
        save_snapshot(store, load_state(store, until=head - 1))
        assert views.health_page(live, store, "here")["snapshot"] == {"position": head - 1, "code": code_version()}
    finally:
        store.close()
        live.close()
