"""The checks' verdicts, parser and repair scripts as pure functions: no host, no ledger."""

from __future__ import annotations

from types import SimpleNamespace

from ledger.app.commands.doctor import _print_findings
from ledger.describe import summarize
from reconciler.doctor import (
    CHECKS,
    Context,
    Facts,
    JobInfo,
    Paths,
    Proc,
    Report,
    fixes,
    judge,
    probe,
)
from reconciler.doctor.model import Finding
from reconciler.doctor.owners import ago
from reconciler.doctor.records import repaired, started_pids
from reconciler.doctor.run import Repair

PATHS = Paths()
NOW = 1_800_000_000.0
JOBS = {
    "alice/old-run": JobInfo(state="finished", ended=True, ended_at=NOW - 2 * 3600, attempt=1),
    "bob/live": JobInfo(state="running", ended=False, attempt=1),
}


def ctx(**kw) -> Context:
    base = {"job_id": "carol/next", "attempt": 2, "spec": {}, "tpu": "lab", "shared": True, "jobs": JOBS, "now": NOW}
    return Context(**{**base, **kw})


def facts(worker: int = 0, **kw) -> Facts:
    f = Facts(worker, devices=["/dev/accel0", "/dev/accel1"], disk=[("/", 50 << 30), ("/tmp", 50 << 30)], python="3.11.2")
    for k, v in kw.items():
        setattr(f, k, v)
    return f


def holding(pid: int, job: str = "", attempt: int | None = None, *, lock: bool = False, pgid: int = 0) -> dict:
    paths = ["/dev/accel0", *(["/tmp/libtpu_lockfile"] if lock else [])]
    proc = Proc(pid, pgid or pid, pgid or pid, 555, job=job, attempt=attempt, worker=0, cmd="python train.py")
    return {"holders": {pid: paths}, "procs": {pid: proc}, **({"lockfile": "/tmp/libtpu_lockfile"} if lock else {})}


def by_check(report, check: str):
    return [f for f in report.findings if f.check == check]


def test_a_clean_host_is_healthy():
    r = judge({0: facts(), 1: facts(1)}, ctx(), PATHS)
    assert r.health == "healthy" and not r.fixable and not r.failures
    assert by_check(r, "devices")[0].message == "2 device(s) free"


def test_a_holder_of_an_ended_job_is_killed_and_says_whose_it_was():
    r = judge({0: facts(**holding(4242, "alice/old-run", 1))}, ctx(), PATHS)
    [f] = by_check(r, "devices")
    assert f.status == "fix" and f.fix is not None and f.fix.kind == "kill" and f.fix.pids == ((4242, 555),)
    assert f.fix.done == "killed pid 4242 (alice/old-run, ended 2 h ago) holding /dev/accel0"
    assert r.health == "needs fixing"


def test_a_live_jobs_process_is_never_killed():
    r = judge({0: facts(**holding(77, "bob/live", 1, lock=True))}, ctx(), PATHS)
    assert {f.check: f.status for f in r.findings if f.status != "ok"} == {"devices": "fail", "libtpu_lock": "fail"}
    assert not r.fixable and "bob/live, running: a live job" in r.problem()


def test_a_process_nobody_knows_is_not_killed():
    r = judge({0: facts(**holding(9))}, ctx(), PATHS)
    assert [f.status for f in by_check(r, "devices")] == ["fail"] and "owner unknown" in r.problem()
    r = judge({0: facts(**holding(9, "zed/elsewhere", 3))}, ctx(), PATHS)
    assert "a job this ledger does not know" in r.problem()


def test_this_jobs_running_attempt_is_fine_and_its_earlier_attempts_are_leftovers():
    r = judge({0: facts(**holding(10, "carol/next", 2))}, ctx(), PATHS)
    assert [f.status for f in by_check(r, "devices")] == ["ok"]
    r = judge({0: facts(**holding(11, "carol/next", 1))}, ctx(), PATHS)
    assert [f.status for f in by_check(r, "devices")] == ["fix"]
    # a process whose env cannot be read belongs to attempt 1 by the pgid the ledger recorded
    left = facts(mine={12, 13}, procs={12: Proc(12, 300, 300, 1), 13: Proc(13, 999, 999, 1)})
    r = judge({0: left}, ctx(started={0: {300: 1}}), PATHS)
    assert [(f.status, f.message.split(" (")[0]) for f in by_check(r, "leftovers")] == [("fix", "pid 12")]


def test_leftovers_of_other_workers_on_one_machine_are_not_this_workers():
    other = Proc(20, 20, 20, 1, job="carol/next", attempt=1, worker=5)
    r = judge({0: facts(mine={20}, procs={20: other})}, ctx(), PATHS)
    assert [f.status for f in by_check(r, "leftovers")] == ["ok"]


def test_the_lockfile_goes_when_nobody_holds_it_or_once_its_holder_is_killed():
    r = judge({0: facts(lockfile="/tmp/libtpu_lockfile")}, ctx(), PATHS)
    [f] = by_check(r, "libtpu_lock")
    assert f.status == "fix" and f.fix is not None and f.fix.kind == "rm_lock" and "no process holds it" in f.message
    r = judge({0: facts(**holding(4242, "alice/old-run", 1, lock=True))}, ctx(), PATHS)
    assert [f.status for f in by_check(r, "libtpu_lock")] == ["fix"]


def test_a_missing_gcsfuse_mount_is_remounted_and_a_full_disk_fails():
    spec = {"gcsfuse": {"bucket_name": "data", "mount_path": "~/gcs"}}
    home_gcs = "/home/ledger/gcs"
    r = judge({0: facts(wanted=[("~/gcs", home_gcs)], mounts=[])}, ctx(spec=spec), PATHS)
    [f] = by_check(r, "mounts")
    assert f.status == "fix" and f.fix is not None and (f.fix.kind, f.fix.bucket, f.fix.path) == ("remount", "data", "~/gcs")
    r = judge({0: facts(wanted=[("~/gcs", home_gcs)], mounts=[("data", home_gcs, "fuse.gcsfuse")])}, ctx(spec=spec), PATHS)
    assert [f.status for f in by_check(r, "mounts")] == ["ok"]
    r = judge({0: facts(disk=[("/", 10 << 20), ("/tmp", 50 << 30)])}, ctx(), PATHS)
    assert [f.status for f in by_check(r, "disk")] == ["fail"] and "only 10.0 MiB free on /" in r.problem()


def test_versions_that_differ_across_workers_are_a_warning_on_the_odd_one():
    hosts = {w: facts(w, packages={"jax": "0.4.31", "libtpu": "0.0.2"}) for w in range(4)}
    hosts[2].packages["jax"] = "0.4.30"
    r = judge(hosts, ctx(), PATHS)
    warns = [f for f in r.findings if f.status == "warn"]
    assert [(f.worker, f.message) for f in warns] == [(2, "jax 0.4.30 here, 0.4.31 on the other workers")]
    assert r.health == "warning"


def test_an_unreachable_host_fails():
    r = judge({0: Facts(0, error="connection refused")}, ctx(), PATHS)
    assert r.health == "unhealthy" and "cannot probe" in r.problem()


def test_the_parser_reads_what_the_probe_prints_and_shows_paths_as_the_vm_sees_them():
    out = "\n".join([
        "root\t/srv/h/w0/.vm\t/srv/h/w0", "dev\t/srv/h/w0/.vm/dev/accel0",
        "holder\t42\t/srv/h/w0/.vm/dev/accel0", "lock\t/srv/h/w0/.vm/tmp/libtpu_lockfile", "mine\t43",
        "proc\t42\t42\t42\t777\tLEDGER_JOB_ID=a/b LEDGER_ATTEMPT=1 LEDGER_WORKER_ID=0 \tpython -c x ",
        "df\t1024\t/", "py\tPython 3.11.2", "pkg\tlibtpu_nightly-0.1.dev2024.dist-info", "garbage line", "proc\tcut",
    ])
    f = probe.parse(0, out)
    assert f.devices == ["/dev/accel0"] and f.holders == {42: ["/dev/accel0"]} and f.lockfile == "/tmp/libtpu_lockfile"
    assert f.procs[42] == Proc(42, 42, 42, 777, job="a/b", attempt=1, worker=0, cmd="python -c x")
    assert f.mine == {43} and f.disk == [("/", 1 << 20)] and f.python == "3.11.2"
    assert f.packages == {"libtpu-nightly": "0.1.dev2024"}


def test_probe_and_repair_scripts_quote_what_comes_from_a_spec():
    evil = "x'; rm -rf / #"
    text = probe.script(CHECKS, PATHS, ctx(job_id=evil, spec={"gcsfuse": {"bucket_name": "b", "mount_path": evil}}))
    assert "LEDGER_JOB_ID=x'\"'\"'; rm -rf / #'" in text and "rm -rf / #'" in text
    r = judge({0: facts(wanted=[(evil, "/x")])}, ctx(spec={"gcsfuse": {"bucket_name": evil, "mount_path": evil}}), PATHS)
    script = fixes.script([f.fix for f in r.fixable if f.fix], PATHS)
    assert "gcsfuse --implicit-dirs 'x'\"'\"'; rm -rf / #'" in script
    assert fixes.parse("done\t0\nfailed\t1\nnoise\n", 3) == [True, False, False]


def test_the_pids_the_ledger_started_on_this_tpu_before_this_attempt():
    ev = lambda t, d: SimpleNamespace(type=t, data=d)  # noqa: E731
    events = [ev("provisioned", {"tpu": {"name": "lab"}}), ev("started", {"attempt": 1, "pids": {"0": 100, "1": 101}}),
              ev("provisioned", {"tpu": {"name": "other"}}), ev("started", {"attempt": 2, "pids": {"0": 200}}),
              ev("provisioned", {"tpu": {"name": "lab"}}), ev("started", {"attempt": 3, "pids": {"0": 300}})]
    assert started_pids(events, 3, "lab") == {0: {100: 1}, 1: {101: 1}}


def test_inspect_says_what_was_killed_and_whose_it_was():
    line = summarize("action_outcome", {"action_id": "x", "ok": True, "action": "clean", "result": {
        "tpu": "lab", "health": "fixed",
        "done": [{"worker": 0, "check": "devices", "what": "killed pid 4242 (alice/old-run, ended 2 h ago) holding /dev/accel0"}],
        "failed": []}})
    assert line == "worker 0: killed pid 4242 (alice/old-run, ended 2 h ago) holding /dev/accel0"
    found = summarize("action_intent", {"action_id": "x", "action": "clean", "params": {"found": [
        {"worker": 1, "check": "libtpu_lock", "status": "fix", "message": "stale lockfile /tmp/libtpu_lockfile"}]}})
    assert found == "host checks will repair: worker 1: stale lockfile /tmp/libtpu_lockfile"
    assert [ago(s) for s in (5, 600, 7200, 200000)] == ["5 s ago", "10 min ago", "2 h ago", "2 d ago"]


def test_after_the_repairs_each_finding_says_what_was_done_or_that_it_failed():
    r = judge({0: facts(**holding(4242, "alice/old-run", 1, lock=True)), 1: facts(1, lockfile="/tmp/libtpu_lockfile")}, ctx(), PATHS)
    kill, lock0, lock1 = r.fixable
    after = repaired(r, [Repair(kill, True), Repair(lock0, True), Repair(lock1, False)])
    assert {(f.worker, f.check): (f.status, f.message) for f in after.findings if f.check in ("devices", "libtpu_lock")} == {
        (0, "devices"): ("ok", "killed pid 4242 (alice/old-run, ended 2 h ago) holding /dev/accel0"),
        (0, "libtpu_lock"): ("ok", "removed stale lockfile /tmp/libtpu_lockfile"),
        (1, "devices"): ("ok", "2 device(s) free"),
        (1, "libtpu_lock"): ("fail", "stale lockfile /tmp/libtpu_lockfile (no process holds it) (the repair failed)"),
    }
    assert after.health == "unhealthy" and not after.fixable


def test_a_finding_with_brackets_is_printed_as_it_is(monkeypatch, capsys):
    """A finding quotes a host's words (a process's command line): a "[" there is text, not
    rich markup (a stray "[/]" made rich raise, and `ledger doctor` print a traceback),
    boxed on a terminal as in plain columns."""
    report = Report(findings=[Finding("tpu_free", 0, "fail", "held by pid 42: python train.py --tag [/] [bold]x")])
    _print_findings(report, "t", {})
    plain = capsys.readouterr().out.splitlines()
    assert plain[1].split() == ["worker", "check", "status", "finding", "safe", "repair"]
    assert plain[2].split()[:3] == ["0", "tpu_free", "fail"] and "python train.py --tag [/] [bold]x" in plain[2]
    monkeypatch.setenv("FORCE_COLOR", "1")
    _print_findings(report, "t", {})
    assert "--tag [/] [bold]x" in capsys.readouterr().out
