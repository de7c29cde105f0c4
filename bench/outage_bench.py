"""A TPU API outage with jobs in flight: what the reconciler records, logs and calls, and how
soon it carries on once the API is back.

The real stack: the emulator, a SQLite ledger and one reconciler (`ledger.app.wiring.build`,
as `ledger reconcile` runs it) in a thread. JOBS jobs run on their TPUs (one command ends
during the outage, so there is work waiting when the API returns). Then the API goes down
for OUTAGE seconds, in one of three ways:

- `down`:   the endpoint is gone (a TCP proxy in front of the emulator stops listening and
            drops its connections): the gRPC channel fails to connect;
- `refuse`: the emulator answers every call UNAVAILABLE (`ledger emulator outage refuse`);
- `hang`:   the emulator answers nothing (`outage hang`): calls run into their deadline.

Measured, from the outage's start to its end: events appended (all streams), log lines
(the reconciler's log records at INFO and above, plus one line per action as `ledger
reconcile` prints them), API calls and the gaps between them; and after the end: seconds
until the first call that succeeds and until the job whose command ended meanwhile is
recorded `finished` (work resumed).

    python bench/outage_bench.py [--outage 60] [--jobs 5] [--modes down refuse hang] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emulator import Emulator  # noqa: E402
from ledger.app.wiring import Settings, build  # noqa: E402
from ledger.events import NewEvent, actor  # noqa: E402
from ledger.fold import FINISHED, RUNNING, replay  # noqa: E402
from ledger.spec.model import spec_hash  # noqa: E402
from ledger.store import open_store  # noqa: E402

ZONE = "us-central2-b"


class Proxy:
    """A TCP relay in front of the emulator's gRPC port that can go down and come back on the
    same port: an endpoint that disappears, as a network or front-end outage looks."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def up(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def down(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


class Lines(logging.Handler):
    """Counts the reconciler's log lines (INFO and above) while `counting`."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counting = False
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.counting:
            self.lines.append(f"{record.levelname} {record.getMessage()}"[:200])


def spec(cmd: str) -> dict:
    return {
        "job": {"name": "bench", "env_type": "none", "loop": False},
        "tpu": {"allocation_mode": "tpu-vm", "accelerator": "v4-8", "zone": ZONE, "pricing": "spot"},
        "setup": {"modules": ["command"]},
        "command": {"cmd": cmd, "workers": "all", "env": {}},
        "recovery": {"max_restarts": 3},
    }


def run(mode: str, outage: float, jobs: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="outage-bench-"))
    emu = Emulator(state_dir=tmp / "emulator").start()
    proxy = Proxy(("127.0.0.1", emu.port))
    proxy.up()
    store_url = f"sqlite:///{tmp / 'ledger.db'}"
    store = open_store(store_url)
    lines = Lines()
    logging.getLogger("tpu_ledger").addHandler(lines)
    logging.getLogger("tpu_ledger").setLevel(logging.INFO)
    calls: list[tuple[float, str, str]] = []

    def on_action(action, result) -> None:  # `ledger reconcile` prints one line per action
        if lines.counting:
            lines.lines.append(f"ACTION {action.kind} {action.job_id}: {result}"[:200])

    settings = Settings(store_url=store_url, tpu_endpoint=proxy.endpoint, ssh_key=tmp / "ssh" / "id_ecdsa",
                        log_dir=tmp / "logs", holder="bench")
    rec = build(settings, on_action=on_action)
    rec.tpu.observers.append(lambda method, code, seconds: calls.append((time.time(), method, code)))
    stop = threading.Event()
    thread = threading.Thread(target=rec.run, kwargs={"stop": stop}, daemon=True)
    try:
        names = [f"bench/j{i}" for i in range(jobs)]
        for i, job_id in enumerate(names):
            cmd = f"sleep {outage / 2 + 10:.0f}" if i == 0 else "sleep 3600"
            s = spec(cmd)
            data = {"spec": s, "spec_hash": spec_hash(s), "commit": hashlib.sha1(job_id.encode()).hexdigest(),
                    "path": f"jobs/{job_id}.yaml"}
            store.append(job_id, [NewEvent("submitted", data, actor("git", "bench"))])
        thread.start()
        deadline = time.monotonic() + 120
        while not all(replay(store.read_stream(j)).jobs[j].state == RUNNING for j in names):
            if time.monotonic() > deadline:
                raise RuntimeError("the jobs never all ran")
            time.sleep(0.2)
        time.sleep(2)
        head = store.head()
        lines.counting = True
        t0 = time.time()
        if mode == "down":
            proxy.down()
        else:
            emu.outage(mode)
        time.sleep(outage)
        appended = [(e.stream, e.type) for e in store.read_all() if e.seq > head]
        t1 = time.time()
        lines.counting = False
        if mode == "down":
            proxy.up()
        else:
            emu.outage(None)
        during = [c for c in calls if t0 <= c[0] < t1]
        deadline = time.monotonic() + 120
        finished_at = None
        while time.monotonic() < deadline:
            events = store.read_stream(names[0])
            done = [e for e in events if e.type == "finished"]
            if done:
                from ledger.events import parse_time

                finished_at = parse_time(done[0].time).timestamp()
                break
            time.sleep(0.1)
        first_ok = next((c[0] for c in calls if c[0] >= t1 and c[2] == "OK"), None)
        gaps = [b[0] - a[0] for a, b in zip(during, during[1:], strict=False) if b[1] == "ListNodes" and a[1] == "ListNodes"]
        lists = [c for c in during if c[1] == "ListNodes"]
        state = replay(store.read_stream(names[0])).jobs[names[0]].state
        return {
            "mode": mode, "outage_s": outage, "jobs": jobs,
            "events_appended": len(appended), "events": appended,
            "log_lines": len(lines.lines), "lines": lines.lines,
            "calls_during": len(during), "list_calls_during": len(lists),
            "list_gap_s": {"min": round(min(gaps), 2), "median": round(statistics.median(gaps), 2), "max": round(max(gaps), 2)} if gaps else None,
            "first_ok_call_after_s": round(first_ok - t1, 2) if first_ok else None,
            "work_resumed_after_s": round(finished_at - t1, 2) if finished_at else None,
            "job0_state": state if state == FINISHED else f"{state} (not finished)",
        }
    finally:
        stop.set()
        thread.join(60)
        rec.drain(30)
        rec.close()
        logging.getLogger("tpu_ledger").removeHandler(lines)
        store.close()
        proxy.down()
        emu.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--outage", type=float, default=60.0)
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--modes", nargs="+", default=["down", "refuse", "hang"], choices=["down", "refuse", "hang"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = [run(mode, args.outage, args.jobs) for mode in args.modes]
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"load": load, "results": results}, indent=2))
        return
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    for r in results:
        print(f"\n{r['mode']}: {r['outage_s']:.0f} s outage, {r['jobs']} jobs running")
        print(f"  events appended during it: {r['events_appended']} {r['events']}")
        print(f"  log lines during it:       {r['log_lines']}")
        for line in r["lines"]:
            print(f"    {line}")
        print(f"  API calls during it:       {r['calls_during']} ({r['list_calls_during']} ListNodes; gaps {r['list_gap_s']})")
        print(f"  first call that succeeds:  {r['first_ok_call_after_s']} s after the API's return")
        print(f"  work resumed (finished):   {r['work_resumed_after_s']} s after the API's return ({r['job0_state']})")


if __name__ == "__main__":
    main()
