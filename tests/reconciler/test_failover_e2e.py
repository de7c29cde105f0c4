"""Failover against the emulator: the first choice stocked out, the job is created on its
next choice in the next pass, the stockout recorded with the API's answer and the choice,
the command told where it landed, and usage charging what was placed."""

from __future__ import annotations

from ledger.fold import FINISHED
from ledger.store import open_store
from ledger.usage import UsageFold
from tests.reconciler.conftest import Harness, job_spec

CMD = 'echo "on $LEDGER_ACCELERATOR $LEDGER_PRICING $LEDGER_ZONE chips=$LEDGER_CHIPS choice=$LEDGER_PLACEMENT"'
FALLBACK = {"accelerator": "v6e-4", "zone": "us-east1-d", "pricing": "spot", "allocation_mode": "tpu-vm",
            "version": "v2-alpha-tpuv6e", "hosts": 1, "chips": 4}


def test_a_stocked_out_first_choice_fails_over_to_the_next(harness: Harness):
    harness.emu.set_capacity("us-central2-b", "v4", 0, "spot")
    spec = job_spec(CMD, tpu={"fallbacks": [FALLBACK]})
    harness.submit("nina/fo", spec)
    harness.start()
    done = harness.wait("nina/fo", lambda j: j.state == FINISHED and j.tpu is None, timeout=60)
    assert done.attempt == 1
    store = open_store(harness.store_url)
    events = list(store.read_stream("nina/fo"))
    store.close()
    stockout = next(e for e in events if e.type == "queued" and e.data.get("api"))
    assert stockout.data["api"]["code"] == "RESOURCE_EXHAUSTED" and stockout.data["api"]["kind"] == "stockout"
    assert stockout.data["placement"] == {"zone": "us-central2-b", "accelerator": "v4-8", "pricing": "spot", "kind": "node"}
    provisioning = [e for e in events if e.type == "provisioning"]
    assert [p.data["tpu"].get("placement", 0) for p in provisioning] == [1]
    assert provisioning[0].data["tpu"]["zone"] == "us-east1-d" and provisioning[0].data["tpu"]["pricing"] == "spot"
    assert "on v6e-4 spot us-east1-d chips=4 choice=1" in harness.output("nina/fo", 1)
    # usage charges the v6e that ran, not the v4 asked for first
    held = {k.accelerator for k, v in UsageFold().apply_rows(
        [(e.seq, e.stream, e.version, e.type, e.time, e.data) for e in events], decoded=True).figures().items() if sum(v[1:6])}
    assert held == {"v6e-4"}
    harness.verify()
