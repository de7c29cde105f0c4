"""Persistent connections and watchers against a real OpenSSH sshd.

One connection per host however many probes; a watcher per running host that answers the
probes without a round trip and reports the end of the attempt, or of the connection, at
once; and the connections come back after sshd restarts.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
import time
from pathlib import Path

from reconciler.remote import layout
from reconciler.remote.watch import Watchers
from tests.remote.conftest import SSHD

JOB = "o/persist"


def spec(cmd: str) -> dict:
    return {"setup": {"modules": ["command"]}, "command": {"cmd": cmd, "workers": "all", "env": {}}}


def sessions(pod) -> list[int]:
    """The sshd processes serving connections: the children of the listening sshd (one per
    connection), read from /proc, as the server sees them."""
    assert pod.proc is not None
    return [int(c) for c in Path(f"/proc/{pod.proc.pid}/task/{pod.proc.pid}/children").read_text().split()]


def restart_sshd(pod) -> None:
    """Stop the listening sshd and every connection it serves, then start it again on the
    same ports with the same configuration (the jobs, in their own sessions, live on)."""
    children = sessions(pod)
    pod.stop()
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    log = open(pod.root / "sshd.log", "ab")  # noqa: SIM115 - kept open for the process's life
    pod.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(pod.config)], stdout=log, stderr=log)


def test_one_connection_per_host_however_many_probes(pod, runner_for, wait_for):
    r = runner_for(pod)
    r.start(JOB, 1, pod.hosts, spec("echo up; sleep 300"), extra_args=[], resume=False)
    for _ in range(5):
        st = r.probe(JOB, 1, pod.hosts)
        assert {s.state for s in st.values()} == {"running"}
    wait_for(lambda: all(s.output_bytes == 3 for s in r.probe(JOB, 1, pod.hosts).values()))
    assert r.pool.connects == len(pod.hosts)
    assert len(sessions(pod)) == len(pod.hosts)  # the server agrees: one session process each
    assert len(r.watchers) == len(pod.hosts)


def test_commands_and_watchers_work_with_descriptors_past_1024(pod, runner_for, wait_for):
    """A reconciler with a thousand hosts holds more descriptors than select() takes (FD_SETSIZE,
    1,024): each connection's socket, each channel waited on a pipe pair. Starting, probing,
    watching and running a command must still work once every new descriptor is past it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 2048:
        assert hard == resource.RLIM_INFINITY or hard >= 2048, f"RLIMIT_NOFILE hard limit {hard} is below 2,048"
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    filler: list[int] = []
    try:
        while not filler or filler[-1] < 1100:  # every descriptor up to 1,100 taken: the next ones are past it
            filler.append(os.open(os.devnull, os.O_RDONLY))
        r = runner_for(pod)
        r.start(JOB, 1, pod.hosts, spec("echo up; sleep 300"), extra_args=[], resume=False)
        wait_for(lambda: all(s.output_bytes == 3 for s in r.probe(JOB, 1, pod.hosts).values()))
        assert len(r.watchers) == len(pod.hosts)
        assert r.run(pod.hosts[0], "echo past").stdout == b"past\n"
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_watched_probe_streams_output_without_a_round_trip(pod, runner_for, wait_for, monkeypatch):
    r = runner_for(pod)
    hosts = pod.hosts[:1]
    work = pod.home(0) / layout.worker_rel(JOB, 0) / "work"
    r.start(JOB, 1, hosts, spec("echo one; while [ ! -e go ]; do sleep 0.05; done; echo two; sleep 300"),
            extra_args=[], resume=False)
    wait_for(lambda: r.watchers.live((JOB, 1, 0)) or r.probe(JOB, 1, hosts) and False)
    execs = []
    run = r.pool.run
    monkeypatch.setattr(r.pool, "run", lambda *a, **k: execs.append(a) or run(*a, **k))
    (work / "go").touch()
    st = wait_for(lambda: (s := r.probe(JOB, 1, hosts)[0]).output_bytes == 8 and s)
    assert st.state == "running" and execs == []
    assert layout.output_log(r.log_dir, JOB, 1, 0).read_text() == "one\ntwo\n"


def test_the_end_of_the_process_is_heard_at_once(pod, runner_for, wait_for):
    r = runner_for(pod)
    heard = []
    changed = threading.Event()
    r.on_change(lambda job_id: heard.append(job_id) or changed.set())
    hosts = pod.hosts[:2]
    pids = r.start(JOB, 1, hosts, spec("sleep 300"), extra_args=[], resume=False)
    wait_for(lambda: all(s.state == "running" for s in r.probe(JOB, 1, hosts).values()) and len(r.watchers) == 2)
    os.killpg(pids[1], signal.SIGKILL)  # the wrapper and its command die: no exit code recorded
    assert changed.wait(30)  # nobody probed: the host told
    assert heard == [JOB]
    st = r.probe(JOB, 1, hosts)  # the dead group may not be reaped yet: its lock says it died
    assert st[1].state == "gone" and st[0].state == "running"


def test_an_end_whose_wake_up_paramiko_lost_is_heard_within_a_sweep(pod, runner_for, wait_for):
    """paramiko's channel descriptor is a pipe two threads set and clear without one lock
    (paramiko/paramiko#1235): a lost set leaves the selector deaf to that channel. Here every
    set is lost on purpose, after the watcher is armed: the periodic sweep still hears the end."""
    r = runner_for(pod)
    changed = threading.Event()
    r.on_change(lambda job_id: changed.set())
    hosts = pod.hosts[:1]
    pids = r.start(JOB, 1, hosts, spec("sleep 300"), extra_args=[], resume=False)
    wait_for(lambda: r.probe(JOB, 1, hosts)[0].state == "running" and len(r.watchers) == 1)
    [watch] = r.watchers._watches.values()
    # in the selector (its pipe made), everything that came read
    wait_for(lambda: watch.fd is not None and not watch.chan.recv_stderr_ready() and not watch.chan.recv_ready())
    deaf = watch.chan._pipe
    deaf.set = deaf.set_forever = lambda: None  # every wake-up from now on is lost
    os.killpg(pids[0], signal.SIGKILL)
    assert changed.wait(10)  # within a sweep (SWEEP_EVERY), not never


def test_a_step_that_fails_on_the_selectors_thread_leaves_the_watchers_serving(pod, runner_for, wait_for):
    r = runner_for(pod)
    changed, after = threading.Event(), threading.Event()
    r.on_change(lambda job_id: changed.set())
    hosts = pod.hosts[:1]
    pids = r.start(JOB, 1, hosts, spec("sleep 300"), extra_args=[], resume=False)
    wait_for(lambda: r.probe(JOB, 1, hosts)[0].state == "running" and len(r.watchers) == 1)
    r.watchers._call(lambda: 1 / 0)  # a bug in a queued step: the thread used to end on it
    r.watchers._call(after.set)  # queued behind it, in the same turn
    assert after.wait(30)
    os.killpg(pids[0], signal.SIGKILL)
    assert changed.wait(30)


def test_a_watch_whose_read_fails_is_let_go_and_told_and_the_others_still_heard(pod, runner_for, wait_for):
    r = runner_for(pod)
    heard: list[str] = []
    r.on_change(heard.append)
    hosts = pod.hosts[:2]
    pids = r.start(JOB, 1, hosts, spec("sleep 300"), extra_args=[], resume=False)
    wait_for(lambda: all(s.state == "running" for s in r.probe(JOB, 1, hosts).values()) and len(r.watchers) == 2)
    broken, sound = (r.watchers._watches[(JOB, 1, h.worker)] for h in hosts)

    def bug() -> bool:
        raise RuntimeError("a bug in a read")

    broken.chan.recv_stderr_ready = bug
    os.killpg(pids[0], signal.SIGKILL)  # its end arrives: the read fails
    wait_for(lambda: heard == [JOB] and broken.ended and broken.fd is None)
    os.killpg(pids[1], signal.SIGKILL)
    wait_for(lambda: heard == [JOB, JOB] and sound.ended)


def test_a_dropped_connection_is_heard_and_comes_back_after_sshd_restarts(pod, runner_for, wait_for):
    r = runner_for(pod, backoff=0.05)
    changed = threading.Event()
    r.on_change(lambda job_id: changed.set())
    r.start(JOB, 1, pod.hosts, spec("for i in $(seq 1 600); do echo tick $i; sleep 0.2; done"), extra_args=[], resume=False)
    wait_for(lambda: all(s.state == "running" for s in r.probe(JOB, 1, pod.hosts).values()) and len(r.watchers) == 4)
    before = r.pool.connects
    restart_sshd(pod)
    assert changed.wait(30)
    # Reconnected with backoff; the jobs ran on meanwhile and their output carries on.
    st = wait_for(lambda: (s := r.probe(JOB, 1, pod.hosts)) and all(x.state == "running" for x in s.values())
                  and len(r.watchers) == 4 and s)
    assert r.pool.connects == before + 4
    sizes = {w: s.output_bytes for w, s in st.items()}
    wait_for(lambda: all(s.output_bytes > sizes[w] for w, s in r.probe(JOB, 1, pod.hosts).items()))
    text = layout.output_log(r.log_dir, JOB, 1, 2).read_text().splitlines()
    assert text == [f"tick {i}" for i in range(1, len(text) + 1)]  # nothing lost, nothing twice


def test_unreachable_hosts_back_off_without_redialling(pod, runner_for):
    r = runner_for(pod, retries=0, backoff=30)
    failures = []
    r.pool.observers.append(lambda event, host, detail: failures.append(event))
    pod.stop()
    for _ in range(3):
        st = r.probe(JOB, 1, pod.hosts[:1])
        assert st[0].state == "gone"
    # One dial (and one failure heard); the next probes within the backoff step answer at once.
    # (Each probe's command still ends failed: the SSH-errors metric counts three.)
    assert [e for e in failures if e != "command_failed"] == ["unreachable"] and r.pool.connects == 0
    assert failures.count("command_failed") == 3
    assert "next try in" in st[0].error


def test_a_legacy_attempt_without_the_lock_is_probed_and_not_watched(pod, runner_for, wait_for):
    r = runner_for(pod)
    hosts = pod.hosts[:1]
    r.start(JOB, 1, hosts, spec("sleep 300"), extra_args=[], resume=False)
    (pod.home(0) / layout.attempt_rel(JOB, 0, 1) / "alive").unlink()  # as a start before watchers left it
    for _ in range(3):
        assert r.probe(JOB, 1, hosts)[0].state == "running"
    wait_for(lambda: r.watchers.legacy((JOB, 1, 0)))
    assert r.probe(JOB, 1, hosts)[0].state == "running" and len(r.watchers) == 0


def test_idle_connections_close_and_watched_ones_stay(pod, runner_for, wait_for):
    r = runner_for(pod)
    r.start(JOB, 1, pod.hosts[:1], spec("sleep 300"), extra_args=[], resume=False)
    wait_for(lambda: r.probe(JOB, 1, pod.hosts[:1]) and len(r.watchers) == 1)
    assert not any(r.connect(pod.hosts[1:3]).values())
    assert len(r.pool) == 3
    r.pool.idle_close_s = 0.5
    time.sleep(1.0)  # hosts 0 to 2 idle past the limit; host 0 carries a watcher
    assert not any(r.connect(pod.hosts[3:]).values())
    assert len(r.pool) == 2 and r.probe(JOB, 1, pod.hosts[:1])[0].state == "running"
    wait_for(lambda: len(sessions(pod)) == 2)  # the server saw the idle two go


def _watcher_processes(home: Path) -> list[int]:
    """Processes on the host running a watcher's pieces for an attempt under `home`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if argv[0] in (b"flock", b"tail") and any(str(home).encode() in a for a in argv):
                found.append(int(entry.name))
    return found


def test_a_watcher_let_go_of_leaves_nothing_on_the_host(pod, runner_for, wait_for):
    r = runner_for(pod)
    pids = r.start(JOB, 1, pod.hosts[:1], spec("sleep 300"), extra_args=[], resume=False)
    wait_for(lambda: r.probe(JOB, 1, pod.hosts[:1]) and len(r.watchers) == 1)
    wait_for(lambda: len(_watcher_processes(pod.home(0))) == 2)  # its flock and its tail
    r.close()  # the reconciler goes away: its channels close, their stdin ends
    wait_for(lambda: not _watcher_processes(pod.home(0)))
    os.kill(pids[0], 0)  # the job itself runs on


def test_a_watcher_given_a_reused_descriptor_number_still_hears_its_end(pod, runner_for):
    """A dropped watcher's channel closes its descriptors, and the kernel gives their numbers
    to the next files opened. The selector must not keep the dropped watcher under them: a
    stale registration made the next watcher given that number fail to register, deaf to its
    attempt's end (CI waited 30 s for an end it never heard). The selector's thread is held
    while the watcher is dropped and its numbers are taken, as a busy reconciler would."""
    r = runner_for(pod)
    heard = threading.Event()
    watchers = Watchers(lambda job_id: job_id == "c/next" and heard.set())
    host = pod.hosts[0]

    def channel(command: str):
        chan = r.pool.open_channel(host)
        chan.exec_command(command)
        return chan

    try:
        watchers.arm(("a/old", 1, 0), channel("cat"), "old")
        registered, gate, passed = threading.Event(), threading.Event(), threading.Event()
        watchers._call(registered.set)  # after the old watcher's registration
        assert registered.wait(10)
        watchers._call(gate.wait)  # the selector's thread waits here; what follows is queued behind
        watchers.forget(lambda key: False)
        taken = [os.pipe() for _ in range(4)]  # opened meanwhile: the freed numbers are theirs
        gate.set()
        watchers._call(passed.set)
        assert passed.wait(10)
        for a, b in taken:  # free again: the next channel's descriptors may get them
            os.close(a)
            os.close(b)
        watchers.arm(("c/next", 1, 0), channel("sleep 1"), "next")
        assert heard.wait(30)
        assert all(key.data is None or not key.data.ended for key in watchers._sel.get_map().values())
    finally:
        watchers.close()
