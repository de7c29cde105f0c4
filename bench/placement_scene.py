"""The ledger behind docs/img/placement-timeline.png: one job's placements over time.

A job asks for v4-32 spot in us-central2-b, else v6e-16 spot in us-east1-d, else v4-32 on
demand (prefer_first). Spot v4 is out at submission (attempt 1 lands on the v6e); it comes
back and the v6e is preempted (attempt 2 goes back to the first choice); then spot runs out in
both zones and the v4 is preempted (attempt 3 runs on demand). Then, for the picture:

    ledger --store sqlite:///DIR/ledger.db dashboard --port 8977 &
    chromium --headless --no-sandbox --screenshot=placement-timeline.png \
        http://127.0.0.1:8977/jobs/alice/deadline-run

    python bench/placement_scene.py [DIR]     # default: a new temporary folder
"""
import hashlib
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emulator import Emulator, Timings  # noqa: E402
from ledger.app.wiring import Settings, build  # noqa: E402
from ledger.events import NewEvent, actor  # noqa: E402
from ledger.fold import replay  # noqa: E402
from ledger.spec.model import spec_hash  # noqa: E402
from ledger.store import open_store  # noqa: E402

root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="placement-scene-"))
shutil.rmtree(root, ignore_errors=True)
root.mkdir(parents=True)
emu = Emulator(state_dir=root / "emulator", timings=Timings(create=2.0)).start()
url = f"sqlite:///{root / 'ledger.db'}"
store = open_store(url)
spec = {"job": {"name": "deadline-run", "env_type": "none", "loop": False},
        "tpu": {"allocation_mode": "tpu-vm", "accelerator": "v4-32", "zone": "us-central2-b", "pricing": "spot",
                "hosts": 4, "chips": 16, "failover": {"stockouts": 1, "prefer_first": True, "resume_across": True},
                "fallbacks": [{"accelerator": "v6e-16", "zone": "us-east1-d", "pricing": "spot", "allocation_mode": "tpu-vm",
                               "version": "v2-alpha-tpuv6e", "slices": 1, "hosts": 4, "chips": 16},
                              {"accelerator": "v4-32", "zone": "us-central2-b", "pricing": "ondemand", "allocation_mode": "tpu-vm",
                               "version": "tpu-ubuntu2204-base", "slices": 1, "hosts": 4, "chips": 16}]},
        "setup": {"modules": ["command"]},
        "command": {"cmd": 'echo "on $LEDGER_ACCELERATOR $LEDGER_PRICING $LEDGER_ZONE"; for i in $(seq 1 40); do sleep 1; echo "LEDGER_CHECKPOINT step=$i"; done',
                    "workers": "all", "env": {}},
        "recovery": {"max_restarts": 5, "on_preempted": "reapply"}}
job = "alice/deadline-run"
emu.set_capacity("us-central2-b", "v4", 0, "spot")
store.append(job, [NewEvent("submitted", {"spec": spec, "spec_hash": spec_hash(spec), "commit": hashlib.sha1(b"x").hexdigest(),
                                           "path": f"jobs/{job}.yaml"}, actor("git", "alice"))])
rec = build(Settings(store_url=url, tpu_endpoint=emu.endpoint, ssh_key=root / "ssh" / "id_ecdsa", log_dir=root / "logs",
                     holder="scene", interval=1.0, host_checks=False))
stop = threading.Event()
threading.Thread(target=rec.run, kwargs={"stop": stop}, daemon=True).start()


def state():
    return replay(store.read_stream(job)).jobs[job]


while state().state != "running":
    time.sleep(0.2)
time.sleep(12)
emu.set_capacity("us-central2-b", "v4", None, "spot")  # capacity is back
emu.preempt(state().tpu["name"])                      # the v6e is preempted: recovery prefers the first choice
while not (state().state == "running" and state().attempt == 2):
    time.sleep(0.2)
time.sleep(10)
emu.set_capacity("us-central2-b", "v4", 0, "spot")  # spot runs out in both zones
emu.set_capacity("us-east1-d", "v6e", 0, "spot")
emu.preempt(state().tpu["name"])                      # attempt 3 lands on demand
while state().state not in ("finished", "failed_final") or state().tpu is not None:
    time.sleep(0.5)
stop.set()
time.sleep(2)
rec.close()
emu.stop()
print("ledger:", url)
