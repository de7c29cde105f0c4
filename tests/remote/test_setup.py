"""Setup modules on a 4-host pod served by a real sshd.

Neither a Docker engine, Cloud Storage nor conda can run on this machine: `docker`, `gcsfuse`
and `conda` on the hosts' PATH are stand-in executables (see conftest.STANDIN) that record
their argv; these tests check the exact argv the modules send. venv is real (python3 -m venv).
"""

from __future__ import annotations

import stat
import sys

import pytest

from reconciler.remote import layout, scripts

# The placement and Megascale variables every start passes into the container.
PASSED = [w for n in (*scripts.PLACEMENT_ENV, *scripts.MEGASCALE_ENV) for w in ("-e", n)]

JOB = "bob/setup"


def write(tmp_path, name: str, text: str, owner: str = JOB.split("/")[0]):
    """A file in the owner's secrets folder: the only place the runner reads spec files from."""
    p = tmp_path / "secrets" / owner / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def full_spec(tmp_path) -> dict:
    write(tmp_path, "id_pod", "PRIVATE KEY MATERIAL\n")
    write(tmp_path, "id_pod.pub", "ssh-ed25519 AAAAC3Nz pod@ledger\n")
    write(tmp_path, "env.yml", "name: fms\ndependencies: [python=3.11]\n")
    return {
        "setup": {"modules": ["ssh", "gcsfuse", "docker", "command"]},
        "ssh": {"private_key": "unused", "identities": [
            {"private_key": "id_pod", "public_key": "id_pod.pub", "config_entry": "Host 10.*\n  IdentityFile ~/.ssh/id_pod\n"},
        ]},
        "gcsfuse": {"bucket_name": "my-bucket", "mount_path": "~/gcs"},
        "docker": {"image": "repo/img:1", "flags": [], "mount_dirs": [], "env_vars": []},
        "command": {"cmd": "true", "workers": "all", "env": {}},
    }


def test_modules_run_in_parallel_with_per_host_logs_and_are_idempotent(pod, runner_for, tmp_path):
    r = runner_for(pod)
    spec = full_spec(tmp_path)
    rep = r.setup(JOB, 1, pod.hosts, spec)
    assert rep.ok, rep.failures
    assert rep.outcomes == {w: {"ssh": "done", "gcsfuse": "done", "docker": "done"} for w in range(4)}
    for w in range(4):
        home = pod.home(w)
        assert pod.argv(w, "docker") == [["image", "inspect", "repo/img:1"], ["pull", "repo/img:1"]]
        assert pod.argv(w, "gcsfuse") == [["--implicit-dirs", "my-bucket", str(home / "gcs")]]
        key = home / ".ssh" / "id_pod"
        assert key.read_text() == "PRIVATE KEY MATERIAL\n" and stat.S_IMODE(key.stat().st_mode) == 0o600
        assert (home / ".ssh" / "authorized_keys").read_text() == "ssh-ed25519 AAAAC3Nz pod@ledger\n"
        assert "Host 10.*\n  IdentityFile ~/.ssh/id_pod\n" in (home / ".ssh" / "config").read_text()
        for module in ("ssh", "gcsfuse", "docker"):
            log = layout.setup_log(tmp_path / "logs", JOB, 1, module, w).read_text()
            assert f"== {module} on worker {w}" in log and log.rstrip().endswith("done")
        assert "PRIVATE KEY MATERIAL" not in layout.setup_log(tmp_path / "logs", JOB, 1, "ssh", w).read_text()

    # Again: ssh and docker pass their checks and are skipped; nothing is duplicated.
    rep = r.setup(JOB, 2, pod.hosts, spec)
    assert rep.ok and rep.outcomes[0] == {"ssh": "skipped", "docker": "skipped", "gcsfuse": "done"}
    home = pod.home(0)
    assert pod.argv(0, "docker")[2:] == [["image", "inspect", "repo/img:1"]]
    assert (home / ".ssh" / "authorized_keys").read_text().count("pod@ledger") == 1

    # A changed config entry sets ssh up again and replaces the managed block.
    spec["ssh"]["identities"][0]["config_entry"] = "Host github.com\n  User git\n"
    rep = r.setup(JOB, 3, pod.hosts[:1], spec)
    assert rep.outcomes == {0: {"ssh": "done", "gcsfuse": "done", "docker": "skipped"}}
    config = (home / ".ssh" / "config").read_text()
    assert "github.com" in config and "Host 10.*" not in config and config.count("tpu-ledger managed block >>>") == 1


def test_a_host_stops_at_its_first_failing_step(pod, runner_for, tmp_path):
    r = runner_for(pod)
    spec = full_spec(tmp_path)
    spec["setup"]["modules"] = ["gcsfuse", "docker", "command"]
    # Worker 2's mount point cannot be created: a file is in the way.
    gcs = pod.home(2) / "gcs"
    gcs.write_text("a file where the mount point must be")
    rep = r.setup(JOB, 1, pod.hosts, spec, workers=[1, 2])
    assert not rep.ok
    assert [(w, m) for w, m, _ in rep.failures] == [(2, "gcsfuse")]
    assert "mount point exited 1" in rep.failures[0][2]
    assert rep.outcomes[2] == {"gcsfuse": "failed", "docker": "not-run"}
    assert rep.outcomes[1] == {"gcsfuse": "done", "docker": "done"}
    assert pod.argv(2, "docker") == [] and pod.argv(0, "docker") == []  # 0 was not selected
    assert "FAILED: mount point" in layout.setup_log(tmp_path / "logs", JOB, 1, "gcsfuse", 2).read_text()


def test_missing_local_file_fails_setup_with_a_message(pod, runner_for, tmp_path):
    r = runner_for(pod)
    spec = {"setup": {"modules": ["conda"]}, "conda": {"name": "fms", "config_file": "nope.yml"}}
    rep = r.setup(JOB, 1, pod.hosts[:1], spec)
    assert not rep.ok and rep.failures[0][1] == "spec" and "nope.yml" in rep.failures[0][2]


def test_docker_command_runs_in_docker_run_and_stop_kills_the_container(pod, runner_for, wait_for, tmp_path):
    r = runner_for(pod)
    spec = full_spec(tmp_path)
    spec["docker"] = {"image": "repo/img:1", "flags": ["--privileged", "--network=host"],
                      "mount_dirs": ["/home/u", "/a:/b"], "env_vars": ["HOME=/home/u"], "workdir": "/home/u"}
    spec["command"] = {"cmd": "echo in=$LEDGER_WORKER_ID k=$K; sleep 300", "workers": [0], "env": {"K": "v"}}
    r.start(JOB, 1, pod.hosts, spec, extra_args=[], resume=False)
    wait_for(lambda: layout.output_log(r.log_dir, JOB, 1, 0).exists() if r.probe(JOB, 1, pod.hosts[:1]) else False)
    wait_for(lambda: r.probe(JOB, 1, pod.hosts[:1]) and layout.output_log(r.log_dir, JOB, 1, 0).read_text() == "in=0 k=v\n")
    name = "ledger-bob-setup-a1-w0"
    assert pod.argv(0, "docker") == [[
        "run", "--rm", "--name", name, "--privileged", "--network=host", "-v", "/home/u:/home/u",
        "-v", "/a:/b", "-e", "HOME=/home/u", "-e", "LEDGER_JOB_ID", "-e", "LEDGER_ATTEMPT",
        "-e", "LEDGER_WORKER_ID", *PASSED, "-e", "K", "-w", "/home/u", "repo/img:1", "bash", "-c",
        "echo in=$LEDGER_WORKER_ID k=$K; sleep 300",
    ]]
    r.stop(JOB, 1, pod.hosts[:1], grace=5)
    assert pod.argv(0, "docker")[-1] == ["kill", name]
    assert r.probe(JOB, 1, pod.hosts[:1])[0].exit_code == 143


def test_conda_env_from_file_and_command_in_conda_run(pod, runner_for, wait_for, tmp_path):
    r = runner_for(pod)
    big = "name: fms\n" + "# padding\n" * 20000  # 200 KB: too big to inline, sent by stdin
    write(tmp_path, "env.yml", big)
    spec = {"setup": {"modules": ["conda", "command"]}, "conda": {"name": "fms", "config_file": "secret://env.yml"},
            "command": {"cmd": "echo conda ok", "workers": "all", "env": {}}}
    h = pod.hosts[:1]
    assert r.setup(JOB, 1, h, spec).outcomes == {0: {"conda": "done"}}
    uploaded = pod.home(0) / ".tpu-ledger/setup/conda-fms.yml"
    assert uploaded.read_text() == big
    assert pod.argv(0, "conda") == [["env", "update", "--name", "fms", "--file", str(uploaded), "--prune"]]
    assert r.setup(JOB, 1, h, spec).outcomes == {0: {"conda": "skipped"}}
    r.start(JOB, 1, h, spec, extra_args=[], resume=False)
    wait_for(lambda: r.probe(JOB, 1, h)[0].state == "exited")
    assert pod.argv(0, "conda")[-1] == ["run", "--no-capture-output", "-n", "fms", "bash", "-c", "echo conda ok"]
    assert layout.output_log(r.log_dir, JOB, 1, 0).read_text() == "conda ok\n"


@pytest.mark.slow
def test_real_venv_is_created_once_and_the_command_runs_in_it(pod, runner_for, wait_for, tmp_path):
    """A real `python -m venv` (with pip: about 10 s on a loaded 2-core machine), one host."""
    r = runner_for(pod)
    spec = {"setup": {"modules": ["venv", "command"]}, "venv": {"name": "exp", "python": sys.executable},
            "command": {"cmd": "python -c 'import sys; print(sys.prefix)'", "workers": "all", "env": {}}}
    h = pod.hosts[:1]
    assert r.setup(JOB, 1, h, spec).outcomes == {0: {"venv": "done"}}
    assert r.setup(JOB, 1, h, spec).outcomes == {0: {"venv": "skipped"}}
    r.start(JOB, 1, h, spec, extra_args=[], resume=False)
    wait_for(lambda: all(s.state == "exited" for s in r.probe(JOB, 1, h).values()))
    assert layout.output_log(r.log_dir, JOB, 1, 0).read_text() == f"{pod.home(0)}/.tpu-ledger/venvs/exp\n"
