"""The dashboard over both backends: the same pages and API from a SQLite file and from
PostgreSQL, and a new event announced to the browser through the store's append waiter
(LISTEN/NOTIFY on PostgreSQL, a head poll on SQLite)."""

from __future__ import annotations

import http.client
import json
import urllib.parse

from ledger.events import NewEvent, actor
from tests.dashboard.conftest import serve


def test_the_dashboard_reads_either_backend_and_streams_appends(store_factory, ledger_url):
    store = store_factory()
    for i in range(3):
        store.append(f"alice/job-{i}", [NewEvent("submitted", {"spec": {"tpu": {"accelerator": "v4-8"}}, "spec_hash": "ab12ab12",
                                                           "commit": "c0ffee00", "path": f"jobs/alice/job-{i}.yaml"},
                                                 actor("git", "alice"))])
    with serve(ledger_url) as site:
        parts = urllib.parse.urlsplit(site.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
        conn.request("GET", "/api/jobs")
        jobs = json.loads(conn.getresponse().read())
        assert [j["id"] for j in jobs["jobs"]] == ["alice/job-0", "alice/job-1", "alice/job-2"]
        assert jobs["position"] == store.head()
        conn.request("GET", "/jobs/alice/job-1")
        response = conn.getresponse()
        assert response.status == 200 and "alice/job-1" in response.read().decode()
        conn.close()

        stream = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
        stream.request("GET", "/api/stream")
        events = stream.getresponse()
        assert events.readline() == b"retry: 1000\n"
        seq = store.append("alice/job-2", [NewEvent("cancel_requested", {"reason": "test"}, actor("cli", "t"))]).positions[0]
        message = ""
        while "event: ledger" not in message:
            message = b"".join(iter(events.readline, b"\n")).decode()
        stream.close()
        data = json.loads(message.split("data: ", 1)[1])
        assert data["head"] == seq and data["streams"] == ["alice/job-2"] and data["events"][0]["type"] == "cancel_requested"
