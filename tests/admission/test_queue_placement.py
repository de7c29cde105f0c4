"""`ledger queue` and `ledger inspect` say where a waiting job will be placed and why, from the
capacity memory the ledger's stockouts make (a real SQLite ledger, through the CLI)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from ledger.app.cli import cli
from ledger.events import NewEvent, actor
from ledger.events import data as ev
from ledger.store import open_store

GIT = {"spec_hash": "ab" * 32, "commit": "c0ffee", "path": "jobs/a/b.yaml"}
V4 = {"accelerator": "v4-32", "zone": "us-central2-b", "pricing": "spot", "allocation_mode": "tpu-vm", "hosts": 4, "chips": 16}
V5 = {"accelerator": "v5litepod-32", "zone": "us-west4-a", "pricing": "spot", "allocation_mode": "tpu-vm", "hosts": 8, "chips": 32}


def spec(**tpu) -> dict:
    return {"job": {"name": "j"}, "tpu": {**V4, **tpu}, "command": {"cmd": "x", "workers": "all"}, "recovery": {"max_restarts": 3}}


def stockout() -> ev.Queued:
    return ev.Queued(reason="no capacity for v4-32 in us-central2-b",
                     api=ev.ApiStatus(code="RESOURCE_EXHAUSTED", kind="stockout", message="There is no more capacity"),
                     placement=ev.Placement(zone="us-central2-b", accelerator="v4-32", pricing="spot", kind="node"))


def test_queue_and_inspect_explain_the_placement(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    store = open_store(url)
    who = actor("git", "t")
    store.append("alice/fo", [NewEvent("submitted", {"spec": spec(fallbacks=[V5]), **GIT}, who)])
    store.append("bob/one", [NewEvent("submitted", {"spec": spec(), **GIT}, who)])
    store.append("bob/one", [NewEvent("queued", stockout(), actor("reconciler", "r"))])
    store.close()
    run = CliRunner().invoke
    rows = {r["job"]: r for r in json.loads(run(cli, ["--store", url, "queue", "--json"]).output)}
    fo, one = rows["alice/fo"], rows["bob/one"]
    # another job found v4 spot empty: alice's job goes to its second choice, and takes its chips
    assert fo["choice"] == 1 and fo["chips"] == 32 and fo["family"] == "v5litepod"
    assert fo["placement"].startswith("v4-32 spot us-central2-b: out of capacity once, next probe ")
    assert fo["placement"].endswith("; trying v5litepod-32 spot us-west4-a")
    # bob's only choice is out: he waits for the cloud, and says until when
    assert one["wait"] == "cloud" and one["reason"].startswith("waiting for capacity: v4-32 spot us-central2-b: out of capacity once")
    table = run(cli, ["--store", url, "queue"], env={"COLUMNS": "250"}).output
    assert "trying v5litepod-32 spot us-west4-a" in table
    inspect = run(cli, ["--store", url, "inspect", "bob/one"], env={"COLUMNS": "250"}).output
    assert "waiting: #" in inspect and "waiting for capacity: v4-32 spot us-central2-b" in inspect
