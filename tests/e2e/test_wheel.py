"""The product is the wheel: built from this tree, installed into a fresh virtualenv, used as a
new user would (issue 13: `pip install tpu-ledger` then `ledger validate` must work).

Nothing of the source tree can leak in: the wheel is built from a copy, installed without
`-e`, and every command runs from an empty folder with a clean environment (no PYTHONPATH, a
new HOME, the virtualenv's bin first on PATH) and checks which `ledger` package it imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "ledger", "reconciler", "emulator")


class Installed:
    def __init__(self, venv: Path, home: Path, work: Path) -> None:
        self.venv, self.home, self.work = venv, home, work
        self.bin = venv / "bin"
        inherited = [p for p in os.environ.get("PATH", "").split(os.pathsep)
                     if p and not Path(p).resolve().is_relative_to(ROOT)]  # not this tree's .venv/bin
        self.env = {"PATH": os.pathsep.join([str(self.bin), *inherited]), "HOME": str(home),
                    "LANG": "C.UTF-8", "GIT_CONFIG_NOSYSTEM": "1", "TMPDIR": str(work)}

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / "ledger"), *args], cwd=cwd or self.work, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in SOURCES:  # a copy: building writes build/ and *.egg-info next to the sources
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    started = time.monotonic()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(src)],
                   cwd=base, check=True, capture_output=True, timeout=300)
    wheel = next((base / "dist").glob("tpu_ledger-*.whl"))
    built = time.monotonic()
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    # this environment's pip installs into the new one: no ensurepip, no pip in the product's venv
    done = subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "-q", str(wheel)],
                          cwd=base, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"\nwheel: built in {built - started:.1f} s, installed with its dependencies in "
          f"{time.monotonic() - built:.1f} s")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    return Installed(venv, home, work)


def test_the_installed_package_is_the_wheel_not_this_tree(installed: Installed):
    code = "import ledger, reconciler, emulator; print(ledger.__file__, reconciler.__file__, emulator.__file__)"
    done = subprocess.run([str(installed.bin / "python"), "-c", code], cwd=installed.work, env=installed.env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    site = str(installed.venv / "lib")
    assert all(path.startswith(site) for path in done.stdout.split()), done.stdout
    assert str(ROOT) not in done.stdout


def test_init_validate_watch_verify_from_the_wheel(installed: Installed):
    done = installed.run("init", "jobs")
    assert done.returncode == 0, done.stderr
    repo = installed.work / "jobs"
    examples = sorted((repo / "jobs" / "examples").glob("*.yaml"))
    assert len(examples) >= 7

    done = installed.run("validate", "--json", "jobs/examples", cwd=repo)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(done.stdout)
    assert [r["path"] for r in results] == [f"jobs/examples/{p.name}" for p in examples]
    assert all(r["ok"] and not r["errors"] for r in results), results
    done = installed.run("validate", cwd=repo)  # the repository's own check, as its CI runs it
    assert done.returncode == 0 and "file(s) checked: ok" in done.stderr, done.stdout + done.stderr

    store = f"sqlite:///{installed.work / 'ledger.db'}"
    done = installed.run("--store", store, "watch", "--repo", str(repo), "--once")
    assert done.returncode == 0, done.stderr
    done = installed.run("--store", store, "verify", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["events"] >= 1 and report["problem"] is None, report


def test_demo_from_the_wheel(installed: Installed):
    started = time.monotonic()
    done = installed.run("demo", "--no-pubsub", "--workdir", str(installed.work / "demo"), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"\nledger demo --no-pubsub from the wheel: {time.monotonic() - started:.1f} s")


def test_github_pieces_from_the_wheel(installed: Installed):
    """GitHub's web-flow keys ship as package data, githubkit comes with the wheel, and the
    webhook options are there."""
    code = ("from ledger.forge.webflow import SHIPPED_TRUSTED, WebFlowKeys\n"
            "keys = WebFlowKeys.shipped()\n"
            "assert set(SHIPPED_TRUSTED) < set(keys.fingerprints()), keys.fingerprints()\n"
            "from ledger.forge.github import GitHubForge\n"
            "print(GitHubForge('lab/jobs', 'secret-token', base_url='http://127.0.0.1:9'))\n")
    done = subprocess.run([str(installed.bin / "python"), "-c", code], cwd=installed.work, env=installed.env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "GitHubForge(lab/jobs)"
    done = installed.run("watch", "--help")
    assert done.returncode == 0 and "--webhook-listen" in done.stdout and "--forge" in done.stdout


def test_deploy_and_config_from_the_wheel(installed: Installed):
    """The unit files, the example config and the settings index ship as package data: the
    installed `ledger` writes units that run itself, and reads the example as its config."""
    units = installed.work / "units"
    done = installed.run("deploy", "systemd", str(units))
    assert done.returncode == 0, done.stderr
    text = (units / "tpu-ledger-reconcile.service").read_text()
    assert f"ExecStart={installed.bin / 'ledger'} reconcile\n" in text and "ProtectSystem=strict" in text
    analyze = shutil.which("systemd-analyze")
    if analyze:
        verify = subprocess.run([analyze, "verify", *map(str, sorted(units.glob("*.service")))], capture_output=True,
                                text=True, timeout=120)
        assert verify.returncode == 0, verify.stderr
    done = installed.run("--config", str(units / "config.toml.example"), "config", "--json")
    assert done.returncode == 0, done.stderr
    rows = {(r["command"], r["key"]): r for r in json.loads(done.stdout)["settings"]}
    assert rows[("watch", "repo")]["source"] == "file" and rows[("(global)", "log-format")]["value"] == "json"
    (units / "typo.toml").write_text("[reconcile]\nlease-tll = 3\n")
    done = installed.run("--config", str(units / "typo.toml"), "list")
    assert done.returncode == 2 and "typo.toml:2: unknown setting 'lease-tll'" in done.stderr
