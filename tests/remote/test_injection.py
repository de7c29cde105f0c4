"""Shell metacharacters in every spec field reach their destination verbatim.

Each hostile field tries to create a file named after it under CANARY; the test asserts that
none exists, that the user's own command ran (and only it), and that docker/gcsfuse (stand-ins
recording argv, since neither can run here) received the hostile strings as single arguments.
"""

from __future__ import annotations

from reconciler.remote import layout, scripts


def hostile(canary, tag: str) -> str:
    t = canary / tag
    return f"x$(touch {t}-a)`touch {t}-b`;touch {t}-c;'\"; touch {t}-d; \"'\ntouch {t}-e\n&& touch {t}-f |"


def test_nothing_but_the_users_command_is_interpreted(pod, runner_for, wait_for, tmp_path):
    canary = tmp_path / "canary"
    canary.mkdir()
    r = runner_for(pod)
    job = "eve/" + hostile(canary, "jobid").replace("\n", " ")
    env_value = hostile(canary, "env")
    spec = {
        "setup": {"modules": ["gcsfuse", "docker", "command"]},
        "gcsfuse": {"bucket_name": hostile(canary, "bucket"), "mount_path": "~/" + hostile(canary, "mount")},
        "docker": {
            "image": hostile(canary, "image"),
            "flags": [hostile(canary, "flag")],
            "mount_dirs": ["/m" + hostile(canary, "mountdir")],
            "env_vars": ["E=" + hostile(canary, "dockerenv")],
            "workdir": hostile(canary, "workdir"),
        },
        # The user's own command is shell, by definition; it writes what it sees.
        "command": {"cmd": 'touch user_ran; printf "%s" "$SECRET" > env_seen; echo ran',
                    "workers": "all", "env": {"SECRET": env_value}},
        "recovery": {"error_patterns": [], "pass_attempt": True, "attempt_flag": "--stage" + hostile(canary, "flagname")},
    }
    # A key's name is a plain file name in the owner's secrets folder (ledger.spec.secrets
    # refuses any other); the config entry stays hostile.
    keyname = "id_eve-key.1"
    (tmp_path / "secrets" / "eve").mkdir(parents=True)
    (tmp_path / "secrets" / "eve" / keyname).write_text("KEY\n")
    spec["setup"]["modules"].insert(0, "ssh")
    spec["ssh"] = {"identities": [{"private_key": keyname, "config_entry": hostile(canary, "sshconfig")}]}
    hosts = pod.hosts[:2]
    rep = r.setup(job, 1, hosts, spec)
    assert rep.ok, rep.failures
    arg = hostile(canary, "arg")
    r.start(job, 1, hosts, spec, extra_args=[arg], resume=False)
    wait_for(lambda: all(s.state == "exited" for s in r.probe(job, 1, hosts).values()))
    r.stop(job, 1, hosts, grace=1)

    assert sorted(p.name for p in canary.iterdir()) == []  # nothing was injected anywhere
    for h in hosts:
        home = pod.home(h.worker)
        work = home / layout.worker_rel(job, h.worker) / "work"
        assert (work / "user_ran").exists()
        assert not list(home.rglob("keyname-*"))
        assert (home / ".ssh" / layout.escape_segment(keyname)).read_text() == "KEY\n"
        assert hostile(canary, "sshconfig") in (home / ".ssh" / "config").read_text()
        assert (work / "env_seen").read_text() == env_value
        assert pod.argv(h.worker, "gcsfuse") == [["--implicit-dirs", spec["gcsfuse"]["bucket_name"], str(home / spec["gcsfuse"]["mount_path"][2:])]]
        assert (home / spec["gcsfuse"]["mount_path"][2:]).is_dir()
        pull, run = pod.argv(h.worker, "docker")[1:3]
        assert pull == ["pull", spec["docker"]["image"]]
        d = spec["docker"]
        assert run[4:] == [
            d["flags"][0], "-v", f"{d['mount_dirs'][0]}:{d['mount_dirs'][0]}", "-e", d["env_vars"][0],
            "-e", "LEDGER_JOB_ID", "-e", "LEDGER_ATTEMPT", "-e", "LEDGER_WORKER_ID",
            *[w for n in (*scripts.PLACEMENT_ENV, *scripts.MEGASCALE_ENV) for w in ("-e", n)], "-e", "SECRET",
            "-w", d["workdir"], d["image"], "bash", "-c",
            spec["command"]["cmd"] + " " + layout_quote(arg) + " " + layout_quote(spec["recovery"]["attempt_flag"] + "=1"),
        ]
        # The appended args are words after the user's command, not shell.
        out = layout.output_log(r.log_dir, job, 1, h.worker).read_text()
        assert out == f"ran {arg} {spec['recovery']['attempt_flag']}=1\n"


def layout_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)
