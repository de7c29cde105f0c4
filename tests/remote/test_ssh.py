"""SSH layer against a real sshd: host-key pinning, trust on first use, retries."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

from reconciler.remote import Host, HostKeyMismatch, HostUnreachable, layout
from reconciler.remote.ssh import key_name


def test_pinned_host_key_is_accepted_and_nothing_is_recorded(pod, runner_for, tmp_path):
    r = runner_for(pod)
    h = pod.hosts[0]
    pinned = Host(h.worker, h.address, h.port, h.username, host_key=pod.host_key_pub)
    assert r.run(pinned, "echo ok").stdout == b"ok\n"
    assert not (tmp_path / "known_hosts").exists()


def test_tofu_records_then_refuses_a_changed_key(pod, runner_for, tmp_path, other_host_key):
    r = runner_for(pod)
    h = pod.hosts[0]
    assert r.run(h, "true").exit_code == 0
    known = (tmp_path / "known_hosts").read_text()
    assert known.split() == [key_name(h), *pod.host_key_pub.split()]
    # The same host now answers with another key: a fresh runner must refuse it.
    (tmp_path / "known_hosts").write_text(f"{key_name(h)} {other_host_key}\n")
    r2 = runner_for(pod)
    with pytest.raises(HostKeyMismatch, match="changed.*refusing"):
        r2.run(h, "true")
    assert (tmp_path / "known_hosts").read_text() == f"{key_name(h)} {other_host_key}\n"
    st = r2.probe("o/j", 1, [h])[0]
    assert st.state == "unknown" and "changed" in st.error


def test_pinned_mismatch(pod, runner_for, other_host_key, monkeypatch):
    r = runner_for(pod)
    h = pod.hosts[0]
    wrong = Host(h.worker, h.address, h.port, h.username, host_key=other_host_key)
    attempts = []
    connect_once = r.pool._connect_once  # the real connection, counted
    monkeypatch.setattr(r.pool, "_connect_once", lambda host: attempts.append(host) or connect_once(host))
    with pytest.raises(HostKeyMismatch, match="pinned from the TPU API"):
        r.run(wrong, "true")
    assert len(attempts) == 1  # never retried


class FlakyProxy:
    """Listens late, drops the first connections mid-handshake, then forwards to sshd."""

    def __init__(self, target_port: int, *, listen_after: float, drop_first: int) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
            self.port = s.getsockname()[1]
        self.target = target_port
        self.listen_after = listen_after
        self.drop_first = drop_first
        self.accepted = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        time.sleep(self.listen_after)  # until then: connection refused
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.2", self.port))
        srv.listen(16)
        srv.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                c, _ = srv.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            if self.accepted <= self.drop_first:
                c.close()  # EOF before the SSH banner
                continue
            up = socket.create_connection(("127.0.0.2", self.target))
            for a, b in ((c, up), (up, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()
        srv.close()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def test_transient_failures_are_retried_and_told_apart_from_exit_codes(pod, runner_for):
    proxy = FlakyProxy(pod.hosts[0].port, listen_after=0.4, drop_first=2)
    try:
        r = runner_for(pod, retries=8)
        h = Host(0, "127.0.0.2", proxy.port, pod.hosts[0].username)
        res = r.run(h, 'echo once >> "$HOME/count"; exit 7')
        assert res.exit_code == 7  # the command's own failure: a result, not retried
        assert (pod.home(0) / "count").read_text() == "once\n"
        assert proxy.accepted == 3  # two dropped handshakes, then success
    finally:
        proxy.stopping.set()


def test_unreachable_after_retries(runner_for, pod):
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]  # nothing listens here
    r = runner_for(pod, retries=2)
    with pytest.raises(HostUnreachable, match="unreachable after 3 tries"):
        r.run(Host(5, "127.0.0.2", port, pod.hosts[0].username), "true")
    st = r.probe("o/j", 1, [Host(5, "127.0.0.2", port)])
    assert st[5].state == "gone" and "ConnectionRefused" in st[5].error


def test_several_workers_behind_one_endpoint_stay_apart(pod, runner_for, wait_for):
    """Four workers on ONE host:port (one $HOME): the runner keys everything by worker id."""
    r = runner_for(pod)
    h = pod.hosts[0]
    same = [Host(w, h.address, h.port, h.username) for w in range(4)]
    spec = {"command": {"cmd": "echo w=$LEDGER_WORKER_ID; exit $LEDGER_WORKER_ID", "workers": "all", "env": {}}, "setup": {"modules": []}}
    r.start("o/j", 1, same, spec, extra_args=[], resume=False)
    st = wait_for(lambda: (s := r.probe("o/j", 1, same)) and all(v.state == "exited" for v in s.values()) and s)
    assert {w: v.exit_code for w, v in st.items()} == {0: 0, 1: 1, 2: 2, 3: 3}
    for w in range(4):
        assert layout.output_log(r.log_dir, "o/j", 1, w).read_text() == f"w={w}\n"


def test_connect_reports_each_host(pod, runner_for):
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        dead = Host(9, "127.0.0.2", s.getsockname()[1], pod.hosts[0].username)
    r = runner_for(pod, retries=1)
    got = r.connect([*pod.hosts, dead])
    assert {w: e for w, e in got.items() if w != 9} == {0: None, 1: None, 2: None, 3: None}
    assert "unreachable after 2 tries" in got[9]
