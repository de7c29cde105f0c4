"""The command on a pod served by a real OpenSSH sshd: start, status, output, stop."""

from __future__ import annotations

import os
import signal

import pytest

from reconciler.remote import StartFailed, layout

JOB = "alice/train"


def spec(cmd: str, workers="all", env=None, **extra) -> dict:
    s = {"command": {"cmd": cmd, "workers": workers, "env": env or {}}, "setup": {"modules": ["command"]}}
    s.update(extra)
    return s


def alive(pgid: int) -> bool:
    try:
        os.kill(-pgid, 0)
        return True
    except ProcessLookupError:
        return False


def all_exited(r, job, attempt, hosts):
    st = r.probe(job, attempt, hosts)
    return st if all(v.state == "exited" for v in st.values()) else None


def test_all_workers_exit_codes_and_environment(pod, runner_for, wait_for, tmp_path):
    r = runner_for(pod)
    cmd = 'echo "job=$LEDGER_JOB_ID attempt=$LEDGER_ATTEMPT worker=$LEDGER_WORKER_ID greet=$GREET pwd=$PWD"\nexit $((LEDGER_WORKER_ID + 3))'
    pids = r.start(JOB, 1, pod.hosts, spec(cmd, env={"GREET": "hi there"}), extra_args=[], resume=False)
    assert sorted(pids) == [0, 1, 2, 3] and all(p > 1 for p in pids.values())
    st = wait_for(lambda: all_exited(r, JOB, 1, pod.hosts))
    assert {w: s.exit_code for w, s in st.items()} == {0: 3, 1: 4, 2: 5, 3: 6}
    for w in range(4):
        text = layout.output_log(tmp_path / "logs", JOB, 1, w).read_text()
        work = pod.home(w) / layout.worker_rel(JOB, w) / "work"
        assert text == f"job={JOB} attempt=1 worker={w} greet=hi there pwd={work}\n"
        assert (pod.home(w) / layout.attempt_rel(JOB, w, 1) / "exit_code").read_text() == f"{w + 3}\n"


def test_workers_subset_starts_only_there(pod, runner_for, wait_for):
    r = runner_for(pod)
    pids = r.start(JOB, 1, pod.hosts, spec("echo only", workers=[0]), extra_args=[], resume=False)
    assert list(pids) == [0]
    st = wait_for(lambda: (s := r.probe(JOB, 1, pod.hosts)) and s[0].state == "exited" and s)
    assert st[0].exit_code == 0
    for w in (1, 2, 3):
        assert st[w].state == "gone" and "never started" in st[w].error
        assert not (pod.home(w) / ".tpu-ledger" / "jobs").exists()


def test_output_is_fetched_incrementally_and_scanned(pod, runner_for, wait_for, tmp_path):
    r = runner_for(pod)
    # The command prints, then waits for a file the test creates, then prints a GRPC error.
    cmd = 'echo first line; printf "partial GRPC "; while [ ! -e go ]; do sleep 0.05; done; echo "error: UNAVAILABLE"; echo "my custom failure X1"'
    r.start(JOB, 1, pod.hosts[:1], spec(cmd, recovery={"error_patterns": ["custom failure X\\d"]}), extra_args=[], resume=False)
    out = layout.output_log(tmp_path / "logs", JOB, 1, 0)
    first = wait_for(lambda: (s := r.probe(JOB, 1, pod.hosts[:1])[0]) and s.output_bytes >= 24 and s)
    assert first.state == "running" and first.matches == []
    assert out.read_bytes() == b"first line\npartial GRPC "
    r.run(pod.hosts[0], f"touch \"$HOME\"/{layout.worker_rel(JOB, 0)}/work/go")
    matches, kinds = [], []

    def until_exited():
        s = r.probe(JOB, 1, pod.hosts[:1])[0]
        matches.extend(s.matches)  # a watcher streams lines in before the exit is known
        kinds.extend(s.kinds)
        return s.state == "exited" and s

    wait_for(until_exited)
    # The line split across two fetches is scanned once, whole.
    assert matches == ["partial GRPC error: UNAVAILABLE", "my custom failure X1"]
    assert kinds == ["grpc", "grpc"]
    assert out.read_text() == "first line\npartial GRPC error: UNAVAILABLE\nmy custom failure X1\n"
    again = r.probe(JOB, 1, pod.hosts[:1])[0]
    assert again.state == "exited" and again.matches == []


def test_a_watched_host_hands_over_an_unfinished_line_as_a_fetch_by_offset_does(pod, runner_for, wait_for, tmp_path):
    """Once a host's watcher is armed, a line without its end yet (a progress bar) still
    reaches the local log: only where secrets are masked does it wait for its end."""
    r = runner_for(pod)
    cmd = 'echo first line; while [ ! -e go ]; do sleep 0.05; done; printf "step 7 of 9"; sleep 300'
    r.start(JOB, 1, pod.hosts[:1], spec(cmd), extra_args=[], resume=False)
    out = layout.output_log(tmp_path / "logs", JOB, 1, 0)
    wait_for(lambda: (s := r.probe(JOB, 1, pod.hosts[:1])[0]) and s.output_bytes >= 11)
    assert r.watchers.live((JOB, 1, pod.hosts[0].id))  # the probe armed it: from here the output streams in
    r.run(pod.hosts[0], f"touch \"$HOME\"/{layout.worker_rel(JOB, 0)}/work/go")
    wait_for(lambda: r.probe(JOB, 1, pod.hosts[:1])[0].output_bytes >= 22)
    assert out.read_bytes() == b"first line\nstep 7 of 9"


def test_command_survives_connection_loss_and_runner_restart(pod, runner_for, wait_for):
    r1 = runner_for(pod)
    pids = r1.start(JOB, 1, pod.hosts, spec("sleep 300"), extra_args=[], resume=False)
    r1.close()  # every SSH connection is gone, as after a reconciler crash
    r2 = runner_for(pod)
    st = r2.probe(JOB, 1, pod.hosts)
    assert {s.state for s in st.values()} == {"running"}
    for pid in pids.values():
        os.kill(-pid, 0)  # the process group lives (sshd runs on this machine)
    r2.stop(JOB, 1, pod.hosts, grace=10)
    st = wait_for(lambda: all_exited(r2, JOB, 1, pod.hosts))
    assert {s.exit_code for s in st.values()} == {143}


def test_stop_kills_the_process_group_after_grace(pod, runner_for, wait_for):
    r = runner_for(pod)
    # The job ignores SIGTERM, and so do its children: only SIGKILL ends it.
    pids = r.start(JOB, 1, pod.hosts[:2], spec("trap '' TERM; echo ignoring; sleep 300 & sleep 300; wait"), extra_args=[],
                   resume=False)
    # Running is not enough: a TERM before the shell set its trap ends it with 143 (seen in CI).
    wait_for(lambda: all(s.state == "running" and s.output_bytes for s in r.probe(JOB, 1, pod.hosts[:2]).values()))
    errors = r.stop(JOB, 1, pod.hosts[:2], grace=0.5)
    assert errors == {0: None, 1: None}
    st = r.probe(JOB, 1, pod.hosts[:2])
    assert {s.exit_code for s in st.values()} == {137}
    wait_for(lambda: not any(alive(pid) for pid in pids.values()), timeout=10)


def test_start_is_idempotent_per_attempt(pod, runner_for, wait_for, tmp_path):
    r = runner_for(pod)
    s = spec("echo ran >> \"$LEDGER_WORKDIR/runs\"; sleep 300")
    first = r.start(JOB, 1, pod.hosts[:1], s, extra_args=[], resume=False)
    second = r.start(JOB, 1, pod.hosts[:1], s, extra_args=[], resume=False)
    assert first == second
    runs = pod.home(0) / layout.worker_rel(JOB, 0) / "work" / "runs"
    wait_for(runs.exists)
    r.stop(JOB, 1, pod.hosts[:1], grace=5)
    assert runs.read_text() == "ran\n"


def test_resume_keeps_the_workdir_and_rerun_starts_clean(pod, runner_for, wait_for):
    r = runner_for(pod)
    h = pod.hosts[:1]
    s = spec('ls; echo "$LEDGER_ATTEMPT" > ckpt-$LEDGER_ATTEMPT\necho args', recovery={"pass_attempt": True, "attempt_flag": "--stage"})
    outputs = {}
    for attempt, resume, args in ((1, False, []), (2, True, ["--lr=0.1"]), (3, False, [])):
        r.start(JOB, attempt, h, s, extra_args=args, resume=resume)
        wait_for(lambda a=attempt: all_exited(r, JOB, a, h))
        outputs[attempt] = layout.output_log(r.log_dir, JOB, attempt, 0).read_text()
    assert outputs == {
        1: "args --stage=1\n",
        2: "ckpt-1\nargs --lr=0.1 --stage=2\n",  # resume: the first attempt's files are there
        3: "args --stage=3\n",  # rerun: a clean working directory
    }
    work = pod.home(0) / layout.worker_rel(JOB, 0) / "work"
    assert sorted(p.name for p in work.iterdir()) == ["ckpt-3"]


def test_lost_process_and_lost_host_are_gone(pod, runner_for, wait_for):
    r = runner_for(pod, retries=1)
    pids = r.start(JOB, 1, pod.hosts, spec("sleep 300"), extra_args=[], resume=False)
    os.killpg(pids[1], signal.SIGKILL)  # the process dies and leaves no exit code
    st = wait_for(lambda: (s := r.probe(JOB, 1, pod.hosts)) and s[1].state == "gone" and s)
    assert st[1].exit_code is None and "no exit code" in st[1].error
    assert st[0].state == "running"
    pod.stop()  # every host is lost
    r.close()
    r2 = runner_for(pod, retries=1)
    st = r2.probe(JOB, 1, pod.hosts)
    assert {s.state for s in st.values()} == {"gone"}
    assert all("unreachable" in s.error for s in st.values())
    with pytest.raises(StartFailed) as exc:
        r2.start(JOB, 2, pod.hosts[:2], spec("true"), extra_args=[], resume=True)
    assert exc.value.pids == {} and sorted(exc.value.errors) == [0, 1]
    for pid in (pids[0], pids[2], pids[3]):
        os.killpg(pid, signal.SIGKILL)


def test_a_restarted_runner_reports_new_matches_once(pod, runner_for, wait_for):
    h = pod.hosts[:1]
    s = spec("echo 'GRPC error one'; while [ ! -e go ]; do sleep 0.05; done; echo 'GRPC error two'")
    r1 = runner_for(pod)
    r1.start(JOB, 1, h, s, extra_args=[], resume=False)
    # A fresh runner's first probe scans what it fetches itself.
    first = wait_for(lambda: (st := r1.probe(JOB, 1, h)[0]) and st.matches and st)
    assert first.matches == ["GRPC error one"]
    r1.close()
    r2 = runner_for(pod)  # after a restart: what is already in the local log was reported
    r2.run(h[0], f'touch "$HOME"/{layout.worker_rel(JOB, 0)}/work/go')
    seen: list[str] = []
    wait_for(lambda: (st := r2.probe(JOB, 1, h)[0]) and (seen.extend(st.matches) or st.state == "exited"))
    assert seen == ["GRPC error two"]
