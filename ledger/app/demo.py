"""The whole loop on a laptop: a jobs hub, a reviewed job, a preemption, a recovery.

Everything is real except Google Cloud: git repositories and pushes, the SQLite ledger, the
watcher, the reconciler, SSH to the emulator's hosts, and the official Pub/Sub emulator
when this machine has it. The story is checked, not just shown: `DemoResult.ok` is true only
when every expected event happened in order.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from emulator import Emulator
from emulator.pubsub import PUBSUB_EMULATOR, PubSubEmulator
from ledger import defaults
from ledger.app.dashboard.live import LiveLedger
from ledger.app.dashboard.server import Background, create_app, hosts_for
from ledger.app.queueview import LedgerPolicy
from ledger.app.wiring import Settings, build
from ledger.describe import summarize
from ledger.fanout import PubSubSubscriber, StoreSubscriber, Subscriber, start_publisher_thread
from ledger.fold import FINISHED, RUNNING, JobState, replay
from ledger.gitops import Watcher
from ledger.store import open_store
from ledger.usage import POLICY_STREAM, UsageRow, job_usage, to_us
from reconciler.remote import layout

JOB_ID = "alice/demo-pod"
ALICE = ("Alice Ng", "alice@lab.example")
# A member of the template's @lab/tpu-stewards team (.ledger/policy.yaml `teams`).
STEWARD = ("Sam Steward", "sam@lab.example")
# A member of the template's @lab/tpu-admins team, who owns .ledger/ (CODEOWNERS).
ADMIN = ("Ada Admin", "ada@lab.example")
SNEAKY_ID = "alice/sneaky"
PROJECT = defaults.PROJECT
TOPIC = "ledger-events"
STEPS = 16
PREEMPT_AT_STEP = 5

# What the approved pod job's stream must read, intents and outcomes aside.
ATTEMPT = ["provisioning", "provisioned", "setup_started", "setup_done", "started"]
EXPECTED = ["submitted", *ATTEMPT, "preempted", "released", "resumed", *ATTEMPT, "finished", "released"]

POD_SPEC = """\
# yaml-language-server: $schema=../../.ledger/schemas/job.schema.json
# A 4-host pod job that checkpoints every step: a preemption costs at most one step.
# It says so in its output (LEDGER_CHECKPOINT step=N), and the ledger records it, so the
# work a preemption loses counts from the last checkpoint.
job:
  name: demo-pod
  priority: medium
  checkpoints:
    every_s: 1                # record at most one checkpoint a second (default 60)
tpu:
  accelerator: v4-32          # 4 hosts
  zone: us-central2-b
  pricing: spot               # default rules: reapply + resume on preemption
command:
  workers: all
  env:
    CKPT: {bucket}
  cmd: |
    step=$(cat "$CKPT/step" 2>/dev/null || echo 0)
    echo "attempt $LEDGER_ATTEMPT on worker $TPU_WORKER_ID: resuming from step $step"
    while [ "$step" -lt {steps} ]; do
      step=$((step + 1))
      sleep 0.4
      echo "step $step"
      if [ "$TPU_WORKER_ID" = 0 ]; then
        echo "$step" > "$CKPT/step.tmp" && mv "$CKPT/step.tmp" "$CKPT/step"
        echo "LEDGER_CHECKPOINT step=$step"
      fi
    done
    echo "training done"
recovery:
  max_restarts: 3
"""

# Prices for the demo's report: round numbers made up for the demo, not anyone's price list.
# A lab puts its own (contract or public list) in the same block of its policy.
DEMO_PRICES = """
# Demo numbers, made up: USD per chip-hour. Put your own here.
prices:
  v4: {spot: 1.00, ondemand: 3.00}
"""

SNEAKY_SPEC = """\
job:
  name: sneaky
tpu:
  accelerator: v4-8
  zone: us-central2-b
  pricing: ondemand
command:
  cmd: echo "nobody reviewed me"
"""


@dataclass
class DemoResult:
    workdir: Path
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    sneaky_events: list[str] = field(default_factory=list)
    resumed_from: int | None = None
    attempt: int = 0
    seconds: float = 0.0
    pubsub: bool = False
    log_dir: Path | None = None
    store_url: str = ""
    usage: UsageRow | None = None
    checkpoints: list[tuple[int, int]] = field(default_factory=list)  # (attempt, step) before the preemption


def demo_store_url(workdir: Path) -> str:
    return f"sqlite:///{workdir.resolve() / 'ledger.db'}"


def start_dashboard(workdir: Path, *, host: str = "127.0.0.1", port: int = 0) -> Background:
    """`ledger dashboard` over the demo's ledger in `workdir`, served from a thread: started
    before the story, it shows the story as it happens. The ledger is created empty here so
    the dashboard has something to open."""
    workdir.mkdir(parents=True, exist_ok=True)
    url = demo_store_url(workdir)
    open_store(url).close()
    app = create_app(LiveLedger(url, topic=TOPIC), store_label=url, log_dir=workdir / "logs",
                     allowed_hosts=hosts_for(host))
    return Background(app, host, port).start()


def _git(args: list[str], cwd: Path, who: tuple[str, str] = ALICE) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": who[0], "GIT_AUTHOR_EMAIL": who[1],
           "GIT_COMMITTER_NAME": who[0], "GIT_COMMITTER_EMAIL": who[1], "GIT_TERMINAL_PROMPT": "0"}
    done = subprocess.run(["git", "-c", "commit.gpgsign=false", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _ledger(args: list[str], store_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledger", "--store", store_url, *args],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "120"})


def _pubsub_available() -> bool:
    return Path(PUBSUB_EMULATOR).exists() and shutil.which("java") is not None


def _types(store_url: str, job_id: str) -> list[str]:
    """The job's story: its events but intents, outcomes and checkpoints (how many
    checkpoints land depends on timing; `_checkpoints` checks them)."""
    store = open_store(store_url)
    try:
        return [e.type for e in store.read_stream(job_id) if e.type not in ("action_intent", "action_outcome", "checkpointed")]
    finally:
        store.close()


def _checkpoints(store_url: str, job_id: str) -> list[tuple[int, int]]:
    """(attempt, step) of each checkpoint recorded before the preemption."""
    store = open_store(store_url)
    try:
        found = []
        for e in store.read_stream(job_id):
            if e.type == "preempted":
                break
            if e.type == "checkpointed":
                found.append((e.data["attempt"], e.data["step"]))
        return found
    finally:
        store.close()


def _roles(store_url: str, job_id: str) -> tuple[Any, Any, Any]:
    """(author, approvers, merger) of the job's submitted event."""
    store = open_store(store_url)
    try:
        d = next((e.data for e in store.read_stream(job_id) if e.type == "submitted"), {})
        return d.get("author"), d.get("approvers"), d.get("merger")
    finally:
        store.close()


def _usage(store_url: str, job_id: str) -> UsageRow | None:
    store = open_store(store_url)
    try:
        return job_usage(store.read_stream(job_id), to_us(datetime.now(UTC)), policy=store.read_stream(POLICY_STREAM))
    finally:
        store.close()


def _job(store_url: str, job_id: str) -> JobState | None:
    store = open_store(store_url)
    try:
        events = store.read_stream(job_id)
        return replay(events).jobs.get(job_id) if events else None
    finally:
        store.close()


def _wait(what: str, check: Callable[[], Any], deadline: float) -> Any:
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def run_demo(workdir: Path, *, pubsub: bool | None = None, say: Callable[[str], None] = print,
             timeout: float = 110.0) -> DemoResult:
    """Run the story in `workdir` (created if missing); returns what happened."""

    started = time.monotonic()
    deadline = started + timeout
    workdir.mkdir(parents=True, exist_ok=True)
    result = DemoResult(workdir=workdir)
    store_url = result.store_url = demo_store_url(workdir)
    result.log_dir = workdir / "logs"
    bucket = workdir / "bucket"  # stands in for the GCS bucket the pod checkpoints to
    bucket.mkdir(exist_ok=True)
    stop = threading.Event()

    with ExitStack() as stack:
        # 1. The emulators.
        emu = stack.enter_context(Emulator(state_dir=workdir / "emulator"))
        say(f"TPU emulator on {emu.endpoint} (google.cloud.tpu.v2 over gRPC, SSH hosts on loopback)")
        pubsub_host = None
        if pubsub is not False and _pubsub_available():
            ps = PubSubEmulator(workdir / "pubsub-emulator.log")
            ps.start()
            stack.callback(ps.stop)
            pubsub_host = ps.endpoint
            result.pubsub = True
            say(f"Pub/Sub emulator on {pubsub_host} (the official one)")
        elif pubsub:
            raise RuntimeError("the Pub/Sub emulator is not installed here (needs google-cloud-sdk and java)")

        # 2. A hub jobs repository, and alice's clone.
        hub, clone = workdir / "hub.git", workdir / "alice"
        done = _ledger(["init", "--bare", str(hub)], store_url)
        if done.returncode != 0:
            raise RuntimeError(f"ledger init failed: {done.stderr.strip()}")
        _git(["clone", "-q", str(hub), str(clone)], workdir)
        say(f"jobs hub {hub} laid from the template; alice cloned it")

        # 3. Everything that runs: watcher, reconciler, fan-out, and a progress subscriber.
        settings = Settings(store_url=store_url, tpu_endpoint=emu.endpoint, ssh_key=workdir / "ssh" / "id_ecdsa",
                            log_dir=result.log_dir, holder="demo-reconciler", interval=1.0)
        # As `ledger reconcile` does: the sharing rules the watcher recorded from the template's policy.
        rec = build(settings, on_action=lambda a, r: None, policy_source=LedgerPolicy(store_url))
        watcher_store = open_store(store_url)
        watcher = Watcher(str(hub), watcher_store, "main", interval=0.5)
        progress = _progress_source(store_url, pubsub_host)
        threads = [
            threading.Thread(target=rec.run, kwargs={"stop": stop}, name="reconciler", daemon=True),
            threading.Thread(target=watcher.run, name="watcher", daemon=True),
            threading.Thread(target=_print_progress, args=(progress, stop, say), name="progress", daemon=True),
        ]
        pub_stop = threading.Event()
        if pubsub_host:
            pub_thread, pub_stop = start_publisher_thread(store_url, PROJECT, TOPIC, emulator_host=pubsub_host)
            threads.append(pub_thread)

        def shutdown() -> None:
            # Signal everyone first, then wait, then close what they used.
            stop.set()
            pub_stop.set()
            watcher.stop()
            for t in threads:
                t.join(30)
            rec.close()
            watcher_store.close()
            progress.close()

        stack.callback(shutdown)
        for t in threads[:3]:  # the publisher's thread is already running
            t.start()

        # 4. The admins set the prices the usage report uses (the ledger records them).
        policy = clone / ".ledger" / "policy.yaml"
        policy.write_text(policy.read_text() + DEMO_PRICES)
        _git(["commit", "-q", "-am", f"Prices for usage reports\n\nApproved-by: {ADMIN[0]} <{ADMIN[1]}>"], clone)
        _git(["push", "-q", "origin", "main"], clone)
        say("set the (demo) prices in .ledger/policy.yaml, approved by an admin, and pushed")

        # 5. alice proposes a job in a pull request; a steward approves and merges it.
        _git(["checkout", "-q", "-b", "alice/demo-pod"], clone)
        (clone / "jobs" / "alice").mkdir(parents=True, exist_ok=True)
        (clone / "jobs" / "alice" / "demo-pod.yaml").write_text(POD_SPEC.format(bucket=bucket, steps=STEPS))
        check = _ledger(["validate", "--repo", str(clone), str(clone / "jobs" / "alice" / "demo-pod.yaml")], store_url)
        if check.returncode != 0:
            raise RuntimeError(f"the demo job does not validate: {check.stdout}{check.stderr}")
        _git(["add", "-A"], clone)
        _git(["commit", "-q", "-m", "Pod job for the demo"], clone)
        _git(["checkout", "-q", "main"], clone)
        _git(["merge", "-q", "--no-ff", "alice/demo-pod", "-m",
              f"Merge pull request #1 from alice/demo-pod\n\nApproved-by: {STEWARD[0]} <{STEWARD[1]}>"],
             clone, who=STEWARD)
        _git(["push", "-q", "origin", "main"], clone)
        say("merged pull request #1 (alice/demo-pod), approved by a steward, and pushed")

        # ... and pushes another straight to main, with no review: it must never run.
        (clone / "jobs" / "alice" / "sneaky.yaml").write_text(SNEAKY_SPEC)
        _git(["add", "-A"], clone)
        _git(["commit", "-q", "-m", "Quick job, no review"], clone)
        _git(["push", "-q", "origin", "main"], clone)
        say("pushed alice/sneaky straight to main, without review")

        # 6. Midway through training, Google takes the TPU back.
        job = _wait("the pod job to run", lambda: (j := _job(store_url, JOB_ID)) and j.state == RUNNING and j, deadline)
        _wait(f"step {PREEMPT_AT_STEP}", lambda: _step(bucket) >= PREEMPT_AT_STEP, deadline)
        # The story counts the lost work from the last checkpoint the ledger recorded: on a
        # loaded machine the reconciler may not have seen one yet at step 5 (a CI run did not).
        _wait("a checkpoint in the ledger", lambda: _checkpoints(store_url, JOB_ID), deadline)
        node = job.tpu["name"]
        emu.preempt(node)
        say(f"** emulator: preempted {node} at step {_step(bucket)} **")
        done_job = _wait("the job to finish", lambda: (j := _job(store_url, JOB_ID)) and j.state == FINISHED
                         and j.tpu is None and j, deadline)
        _wait("the TPUs to be deleted", lambda: not _nodes(emu), deadline)

    # Everything stopped; now check the story and show the ledger.
    result.seconds = time.monotonic() - started
    result.events = _types(store_url, JOB_ID)
    result.sneaky_events = _types(store_url, SNEAKY_ID)
    result.attempt = done_job.attempt
    result.resumed_from = _resumed_from(result.log_dir, done_job.attempt)
    if result.events != EXPECTED:
        result.problems.append(f"pod job events {result.events} != expected {EXPECTED}")
    roles = _roles(store_url, JOB_ID)
    steward = f"{STEWARD[0]} <{STEWARD[1]}>"
    if roles != (ALICE[1], [steward], steward):
        result.problems.append(f"{JOB_ID} should be asked by {ALICE[1]}, approved and merged by {steward}; "
                               f"the submitted event says (author, approvers, merger) = {roles}")
    if result.sneaky_events != ["rejected"]:
        result.problems.append(f"the unreviewed job should only be rejected, got {result.sneaky_events}")
    if not result.resumed_from:
        result.problems.append("attempt 2 did not resume from a checkpoint")
    result.checkpoints = _checkpoints(store_url, JOB_ID)
    if not result.checkpoints or any(a != 1 for a, _ in result.checkpoints):
        result.problems.append(f"attempt 1 should report checkpoints before its preemption, got {result.checkpoints}")
    verify = _ledger(["verify"], store_url)
    if verify.returncode != 0:
        result.problems.append(f"ledger verify failed: {verify.stdout}{verify.stderr}")
    # The accounting must show what the preemption cost: one preemption, and the work lost.
    result.usage = _usage(store_url, JOB_ID)
    if result.usage is None or result.usage.preemptions != 1 or not result.usage.lost_us or result.usage.cost is None:
        result.problems.append(f"usage of {JOB_ID} should show 1 preemption, its lost work and a cost, got {result.usage}")
    result.ok = not result.problems
    return result


def _progress_source(store_url: str, pubsub_host: str | None) -> Subscriber:
    if pubsub_host:
        return PubSubSubscriber("demo-progress", project=PROJECT, topic=TOPIC, emulator_host=pubsub_host)
    return StoreSubscriber(store_url, after=0)


def _print_progress(source: Any, stop: threading.Event, say: Callable[[str], None]) -> None:
    while not stop.is_set():
        try:
            events = source.receive(timeout=0.3)
        except Exception as exc:  # the progress view must never break the story
            say(f"(progress feed: {exc})")
            return
        for ev in events:
            if ev.stream.startswith("_") or ev.type in ("action_intent", "action_outcome", "note"):
                continue
            say(f"  {ev.time[11:23]}  {ev.stream:<16} {ev.type:<15} {summarize(ev.type, ev.data)}")


def _step(bucket: Path) -> int:
    try:
        return int((bucket / "step").read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _nodes(emu: Any) -> list[Any]:
    client = emu.client()
    try:
        return list(client.list_nodes(parent=f"projects/{PROJECT}/locations/us-central2-b"))
    finally:
        client.transport.close()


def _resumed_from(log_dir: Path, attempt: int) -> int | None:
    text = layout.output_log(log_dir, JOB_ID, attempt, 0)
    if not text.exists():
        return None
    for line in text.read_text().splitlines():
        if "resuming from step" in line:
            return int(line.rsplit(" ", 1)[-1])
    return None
