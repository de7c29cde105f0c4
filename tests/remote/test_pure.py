"""The pure parts: layout, command building, probe parsing, patterns. No server needed."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reconciler.remote import DEFAULT_PATTERNS, classify, layout, modules, patterns, scripts

# The placement and Megascale variables every start passes into the container.
PASSED = [w for n in (*scripts.PLACEMENT_ENV, *scripts.MEGASCALE_ENV) for w in ("-e", n)]


def test_job_paths_escape_every_segment_and_never_climb():
    assert layout.job_rel("alice/llama-8b") == "alice/llama-8b"
    assert layout.job_rel("a/../b") == "a/%2E%2E/b"
    rel = layout.job_rel("o/j$(touch x); rm -rf ~")
    assert "/" not in rel.split("/", 1)[1] and "$" not in rel and " " not in rel
    assert layout.attempt_rel("o/j", 3, 2) == ".tpu-ledger/jobs/o/j/worker-3/attempts/2"


def test_user_command_appends_quoted_args_and_attempt_flag():
    spec = {"command": {"cmd": "python train.py\n"}, "recovery": {"pass_attempt": True, "attempt_flag": "--stage"}}
    got = scripts.user_command(spec, 3, ["--lr=0.1", "--name=a b; rm -rf /"])
    assert got == "python train.py --lr=0.1 '--name=a b; rm -rf /' --stage=3"
    spec["recovery"]["pass_attempt"] = False
    assert scripts.user_command(spec, 3, []) == "python train.py"


def test_bad_env_names_are_refused():
    spec = {"command": {"cmd": "true", "env": {"A;touch x": "1"}}}
    with pytest.raises(ValueError, match="invalid environment variable name"):
        scripts.start_script(spec, "o/j", 1, 0, extra_args=[], resume=False)


def test_docker_launch_is_exact_argv():
    spec = {
        "command": {"cmd": "echo hi", "env": {"K": "v"}},
        "setup": {"modules": ["docker", "command"]},
        "docker": {"image": "img:1", "flags": ["--privileged", "--network=host"], "mount_dirs": ["/a", "/b:/c"],
                   "env_vars": ["HOME=/h"], "workdir": "/w"},
    }
    run = scripts.launch(spec, "o/j", 2, 1, ["--x"])
    assert shlex.split(run.words) == [
        "docker", "run", "--rm", "--name", "ledger-o-j-a2-w1", "--privileged", "--network=host",
        "-v", "/a:/a", "-v", "/b:/c", "-e", "HOME=/h", "-e", "LEDGER_JOB_ID", "-e", "LEDGER_ATTEMPT",
        "-e", "LEDGER_WORKER_ID", *PASSED, "-e", "K", "-w", "/w", "img:1", "bash", "-c", "echo hi --x",
    ]
    assert run.container == "ledger-o-j-a2-w1"


def test_scripts_are_valid_bash():
    spec = {"command": {"cmd": "echo 'it''s' \"$(date)\"\nexit 3", "env": {"A": "x'y\"z\n$(w)"}},
            "setup": {"modules": ["venv", "command"]}, "venv": {"name": "v 1"}}
    for text in (
        scripts.start_script(spec, "o/j", 1, 0, extra_args=["a'b"], resume=True),
        scripts.probe_script("o/j", 0, 1, 10, 100),
        scripts.stop_script("o/j", 0, 1, 2.5),
        scripts.watch_script("o/j", 0, 1, 10),
    ):
        subprocess.run(["bash", "-n", "-c", text], check=True)


def test_the_watcher_names_the_attempt_by_quoted_paths_only():
    """A job id with shell metacharacters stays one word in the watcher's paths."""
    job = "o/j'; touch /tmp/pwned; '$(id)"
    text = scripts.watch_script(job, 3, 2, 41, slice_=1)
    att = layout.home(layout.attempt_rel(job, 3, 2, 1))
    assert text.splitlines()[0] == f"a={att}"
    assert "tail -c +42 -F" in text and "$(id)" not in text.replace(att, "")


def test_parse_probe():
    ans = scripts.parse_probe(b"LEDGER-PROBE exited 3 12\nhello\nworld\n")
    assert (ans.state, ans.exit_code, ans.size, ans.data) == ("exited", 3, 12, b"hello\nworld\n")
    assert scripts.parse_probe(b"LEDGER-PROBE running - 0\n").exit_code is None
    with pytest.raises(ValueError):
        scripts.parse_probe(b"garbage\n")


def test_default_patterns_classify_by_kind():
    assert classify("W: TPU is being preempted now") == "preempted"
    assert classify("TPU node x PREEMPTED") == "preempted"
    assert classify("jax: GRPC error: UNAVAILABLE") == "grpc"
    assert classify("status DEADLINE_EXCEEDED") == "grpc"
    assert classify("Barrier timed out after 30s") == "failure"
    assert classify("RESOURCE_EXHAUSTED: HBM") == "failure"
    assert classify("step 100 loss 2.3") is None
    assert classify("RuntimeError: TPU is already in use by process with pid 4242") == "tpu_busy"
    assert set(DEFAULT_PATTERNS) == {"preempted", "tpu_busy", "grpc", "failure"}


def test_spec_patterns_are_regexes_or_literals():
    compiled = patterns.compile_patterns(["custom.*boom", "unbalanced ("])
    found = patterns.scan("ok\ncustom big boom\nunbalanced ( here\n", compiled)
    assert found == [("grpc", "custom big boom"), ("grpc", "unbalanced ( here")]


def test_module_digests_change_with_inputs():
    files = {"k": b"key1", "k.pub": b"ssh-ed25519 AAAA x"}
    spec = {"ssh": {"identities": [{"private_key": "k", "public_key": "k.pub", "config_entry": "Host x"}]}}
    a = modules.build("ssh", spec, files.__getitem__)
    files["k"] = b"key2"
    b = modules.build("ssh", spec, files.__getitem__)
    assert a.check != b.check
    with pytest.raises(ValueError, match="unknown setup module"):
        modules.build("nix", spec, files.__getitem__)


def test_batches_send_large_uploads_alone_and_markers_parse():
    small, big = modules.Put("s", b"x", "a"), modules.Put("b", b"y" * (modules.INLINE_MAX + 1), "b")
    e = modules.Exec("e", "true")
    assert modules.batches([e, small, big, e, e]) == [[e, small], [big], [e, e]]
    script = modules.batch_script([e, modules.Exec("fail", "echo out; exit 3"), e], "n1")
    res = subprocess.run(["bash", "-c", script], capture_output=True)
    assert modules.parse_batch(res.stdout, "n1") == [(b"", 0), (b"out\n", 3)]
    assert modules.parse_batch(res.stdout, "other") == []


def test_module_script_checks_then_sets_up_in_one_trip(tmp_path):
    flag = tmp_path / "flag"
    mod = modules.Module("m", [modules.Exec("present", f"test -f {flag}")],
                         [modules.Exec("make", f"echo making; touch {flag}"), modules.Exec("after", "exit 4")])
    run = lambda: subprocess.run(["bash", "-c", modules.module_script(mod, "n")], capture_output=True).stdout  # noqa: E731
    out = run()
    assert modules.parse_batch(out, "n", "c") == [(b"", 1)]
    assert modules.parse_batch(out, "n", "s") == [(b"making\n", 0), (b"", 4)]
    out = run()
    assert modules.parse_batch(out, "n", "c") == [(b"", 0)] and modules.parse_batch(out, "n", "s") == []


def test_known_hosts_answers_from_the_file_as_it_is_now(tmp_path):
    """The parsed known_hosts is kept between connects, but every lookup answers what the file
    holds at that moment: keys recorded, appended by another process, removed or changed by hand."""
    import paramiko

    from reconciler.remote.ssh import KnownHosts

    path = tmp_path / "known_hosts"
    one, two = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    kind = one.get_name()
    known = KnownHosts(path)
    assert known.lookup("[a]:1") == {}
    known.record("[a]:1", one)
    known.record("[b]:2", two)
    assert known.lookup("[a]:1") == {kind: one} and known.lookup("[b]:2") == {kind: two}
    with path.open("a") as f:  # another reconciler on this host recorded one more
        f.write(f"[c]:3 {kind} {one.get_base64()}\n")
    assert known.lookup("[c]:3") == {kind: one}
    path.write_text(f"[b]:2 {kind} {two.get_base64()}\n")  # [a]:1 removed by hand (a re-created host)
    assert known.lookup("[a]:1") == {} and known.lookup("[c]:3") == {}
    path.write_text(f"[a]:1 {kind} {two.get_base64()}\n")  # ... and recorded again with its new key
    assert known.lookup("[a]:1") == {kind: two} and known.lookup("[b]:2") == {}
    path.unlink()
    assert known.lookup("[a]:1") == {}



def _watch(home: Path) -> subprocess.Popen:
    """The watcher script of o/j's attempt 1 on worker 0, run by a local bash under HOME=home,
    its stdin held open (the channel) until the test closes it."""
    return subprocess.Popen(["bash", "-c", scripts.watch_script("o/j", 0, 1, 0)], env={"HOME": str(home), "PATH": os.defpath},
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture
def attempt(tmp_path) -> Iterator[tuple[Path, Callable[[], subprocess.Popen]]]:
    """An attempt's directory with its `alive` lock file, and a way to hold that lock (as its
    wrapper does) in a session of its own: hold() takes it, the callable it returns lets go
    (kills the holder's group); whatever is held at the end is let go."""
    att = tmp_path / layout.attempt_rel("o/j", 0, 1)
    att.mkdir(parents=True)
    (att / "alive").touch()
    (att / "output.log").touch()
    holders: list[subprocess.Popen] = []

    def hold() -> subprocess.Popen:
        holder = subprocess.Popen(["flock", "-o", str(att / "alive"), "sh", "-c", "echo held; exec sleep 300"],
                                  stdout=subprocess.PIPE, start_new_session=True)
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"  # the lock is taken
        holders.append(holder)
        return holder

    yield tmp_path, hold
    for holder in holders:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def test_the_watcher_hears_an_attempt_that_ended_before_it_began_waiting(attempt):
    """The wrapper was gone (killed: no exit code) when the watcher started: its lock was free,
    and the watcher says the attempt ended. Its stderr starts full, so its "watching" line
    blocks until the test reads: the lock's check ends meanwhile, as it did on a loaded host.
    (Under bash's `wait -n`, which never returns for a child that exited before it was called,
    the watcher then said nothing until its stdin ended: the end went unheard.)"""
    home, _ = attempt
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write_end, b"x" * 4096)
    os.set_blocking(write_end, True)  # the watcher's writes wait, as on a full channel
    proc = subprocess.Popen(["bash", "-c", scripts.watch_script("o/j", 0, 1, 0)], env={"HOME": str(home), "PATH": os.defpath},
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=write_end)
    os.close(write_end)
    time.sleep(0.5)  # the lock's check has ended; the watcher waits to write "watching"
    got = bytearray()
    with os.fdopen(read_end, "rb") as err:
        reader = threading.Thread(target=lambda: got.extend(err.read()), daemon=True)
        reader.start()
        try:
            assert proc.wait(timeout=10) == 0  # stdin stays open: only the end can stop it
        finally:
            proc.stdin.close()
            reader.join(10)
    assert bytes(got).lstrip(b"x").splitlines() == [b"LEDGER-WATCH watching", b"LEDGER-WATCH ended"]


def test_the_watcher_hears_the_end_of_the_lock_holder_and_not_before(attempt):
    home, hold = attempt
    holder = hold()
    proc = _watch(home)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=1)
    os.killpg(holder.pid, signal.SIGKILL)  # the wrapper and its command die
    assert proc.wait(timeout=10) == 0
    assert proc.stderr.read().splitlines() == [b"LEDGER-WATCH watching", b"LEDGER-WATCH ended"]
    proc.stdin.close()


def test_the_watcher_stops_without_an_end_when_its_stdin_ends(attempt):
    home, hold = attempt
    hold()
    proc = _watch(home)
    proc.stdin.close()  # the reconciler let go of the channel
    assert proc.wait(timeout=10) == 0
    assert proc.stderr.read().splitlines() == [b"LEDGER-WATCH watching"]
