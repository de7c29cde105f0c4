"""The world a chaos run acts on: a ledger (SQLite file or a fresh PostgreSQL schema), a jobs
hub laid by `ledger init` with a clone that pushes approved jobs, and the reconciler's key.

Everything here is real: git repositories and pushes, the store the services use, the
same `ledger` processes a lab runs. Only Google Cloud is the emulator (started by run.py).
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg

from ledger.app.chaos.scenario import JobPlan
from ledger.app.demo import STEWARD, _git  # git as a person; a member of @lab/tpu-stewards
from ledger.events import export_lines
from ledger.store import open_store
from reconciler.keys import ensure_key

OWNER = "chaos"
OWNER_IDENTITY = ("Chaos Monkey", f"{OWNER}@lab.example")
ZONE = "us-central2-b"
FALLBACK_ZONE = "us-east1-d"  # where a job with fallbacks goes when ZONE's v4 runs out (v6e)
ZONES = (ZONE, FALLBACK_ZONE)  # every zone a chaos job may run in: sampled for doubles and orphans
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"

# A spot job that checkpoints every second to a "bucket" (a folder shared by every attempt):
# a preemption, a lost host or a killed command reapplies for a TPU and the next attempt resumes where the
# last one stopped, up to max_restarts times; then the job fails by its `exhausted` rule.
JOB_SPEC = """\
job:
  name: {name}
tpu:
  accelerator: v4-8
  zone: {zone}
  pricing: spot
{placement}command:
  env:
    CKPT: {bucket}
  cmd: |
    step=$(cat "$CKPT/step" 2>/dev/null || echo 0)
    echo "attempt $LEDGER_ATTEMPT resumes at step $step of {seconds}"
    while [ "$step" -lt {seconds} ]; do
      sleep 1
      step=$((step + 1))
      if [ "${{LEDGER_SLICE_ID:-0}}" = 0 ]; then  # one writer: a multislice job's slices share the bucket
        echo "$step" > "$CKPT/step.tmp" && mv "$CKPT/step.tmp" "$CKPT/step"
      fi
    done
    echo done
recovery:
  on_failure: reapply     # a lost host too: a new TPU, and the next attempt resumes
  max_restarts: {max_restarts}
"""
# How the jobs ask for their TPU, in turn: one v4-8; a v4-8 that fails over to a v6e-4 in
# another zone at its first stockout; two slices of v4-8 (one queued resource, multislice).
PLACEMENTS = (
    "",
    f"  failover: {{prefer_first: true, resume_across: true}}\n"
    f"  fallbacks:\n    - {{accelerator: v6e-4, zone: {FALLBACK_ZONE}}}\n",
    "  allocation_mode: queued-resources\n  slices: 2\n",
)


def ledger_cmd(store_url: str, *args: str) -> list[str]:
    """The argv of a `ledger` command, with this interpreter (works from a checkout or a wheel)."""
    return [sys.executable, "-m", "ledger", "--store", store_url, *args]


@dataclass
class World:
    workdir: Path
    store_url: str
    hub: Path
    clone: Path
    ssh_key: Path
    log_dir: Path
    pg_admin: str | None = None   # set when the ledger is a PostgreSQL schema to drop at the end
    pg_schema: str | None = None

    def job_id(self, job: JobPlan) -> str:
        return f"{OWNER}/{job.name}"

    def push_jobs(self, jobs: list[JobPlan], max_restarts: int, branch: str) -> None:
        """Propose `jobs` on a branch, merge it with a steward's approval, push to the hub."""
        folder = self.clone / "jobs" / OWNER
        folder.mkdir(parents=True, exist_ok=True)
        _git(["checkout", "-q", "-b", branch], self.clone)
        for job in jobs:
            bucket = self.workdir / "bucket" / job.name
            bucket.mkdir(parents=True, exist_ok=True)
            (folder / f"{job.name}.yaml").write_text(JOB_SPEC.format(
                name=job.name, zone=ZONE, bucket=bucket, seconds=job.seconds, max_restarts=max_restarts,
                placement=PLACEMENTS[int(job.name[1:]) % len(PLACEMENTS)]))
        _git(["add", "-A"], self.clone)
        # written by the folder's owner: a job runs as its owner only when they wrote or approved it
        _git(["commit", "-q", "-m", f"{len(jobs)} spot job(s) for the chaos run"], self.clone, who=OWNER_IDENTITY)
        _git(["checkout", "-q", "main"], self.clone)
        _git(["merge", "-q", "--no-ff", branch, "-m",
              f"Merge {branch}\n\nApproved-by: {STEWARD[0]} <{STEWARD[1]}>"], self.clone, who=STEWARD)
        _git(["push", "-q", "origin", "main"], self.clone)

    def work_left(self, jobs: list[JobPlan]) -> int:
        """The most seconds of work a job still has to do, by its checkpoint (`work_left`)."""
        return work_left(self.workdir / "bucket", jobs)

    def close(self) -> None:
        if self.pg_admin and self.pg_schema:
            try:
                self._export()
            finally:  # the schema goes even when its events could not be written out
                with psycopg.connect(self.pg_admin, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{self.pg_schema}" CASCADE')

    def _export(self) -> None:
        """The schema goes, its events stay: `ledger import WORKDIR/ledger.jsonl` into a file
        to look into a run (a slow release, a broken invariant) afterwards."""
        store = open_store(self.store_url, create=False)
        try:
            with (self.workdir / "ledger.jsonl").open("w") as out:
                out.writelines(export_lines(store.raw_rows()))
        finally:
            store.close()


def work_left(buckets: Path, jobs: list[JobPlan]) -> int:
    """The most seconds of work any of `jobs` still has to do: its length less the step its
    bucket's checkpoint holds (a job without one has all of it to do). A job the faults kept
    from making progress may need longer than the settle time to end, running all along."""
    def step(job: JobPlan) -> int:
        try:
            return int((buckets / job.name / "step").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0
    return max((max(0, job.seconds - step(job)) for job in jobs), default=0)


def make_world(workdir: Path, store: str, pg_url: str | None = None) -> World:
    workdir.mkdir(parents=True, exist_ok=True)
    pg_admin = pg_schema = None
    if store == "postgres":
        pg_admin = pg_url or DEFAULT_PG
        pg_schema = f"chaos_{secrets.token_hex(5)}"
        store_url = f"{pg_admin}{'&' if '?' in pg_admin else '?'}schema={pg_schema}"
    elif store == "sqlite":
        store_url = f"sqlite:///{workdir.resolve() / 'ledger.db'}"
    else:
        raise ValueError(f"store must be sqlite or postgres, not {store!r}")
    open_store(store_url, create=True).close()
    world = World(workdir=workdir, store_url=store_url, hub=workdir / "hub.git", clone=workdir / "clone",
                  ssh_key=workdir / "ssh" / "id_ecdsa", log_dir=workdir / "logs", pg_admin=pg_admin, pg_schema=pg_schema)
    # One key made before the reconcilers start: two of them must not race to create it.
    ensure_key(world.ssh_key)
    done = subprocess.run(ledger_cmd(store_url, "init", "--bare", str(world.hub)), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ledger init failed: {done.stderr.strip()}")
    _git(["clone", "-q", str(world.hub), str(world.clone)], workdir)
    return world

