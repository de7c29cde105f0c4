"""`ledger deploy systemd DIR`: unit files that `systemd-analyze verify` accepts, running this
installation's `ledger` as a dedicated user, hardened, restarted on failure; and the example
config they point at is one every command accepts."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from ledger.app.cli import cli

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("watch", "reconcile", "fanout", "notify", "dashboard")
HARDENING = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes", "CapabilityBoundingSet": "",
             "RestrictSUIDSGID": "yes"}


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def test_units_verify_and_run_this_ledger_hardened(tmp_path: Path):
    ledger = Path(sys.executable).parent / "ledger"
    out = tmp_path / "units"
    result = CliRunner().invoke(cli, ["deploy", "systemd", str(out), "--user", "tpu-lab", "--ledger", str(ledger),
                                      "--config", "/etc/tpu-ledger/config.toml"])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([*(f"tpu-ledger-{s}.service" for s in SERVICES), "tpu-ledger-backup.service",
                            "tpu-ledger-backup.timer", "tpu-ledger.conf", "config.toml.example"])
    units = sorted(str(p) for p in out.iterdir() if p.suffix in (".service", ".timer"))
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: scripts/test-services.sh installs Debian's systemd"
    done = subprocess.run([analyze, "verify", *units], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    for service in SERVICES:
        s = unit(out / f"tpu-ledger-{service}.service")["Service"]
        assert s["ExecStart"].split()[:2] == [str(ledger), service]
        assert s["User"] == s["Group"] == "tpu-lab" and s["Restart"] == "on-failure" and s["KillSignal"] == "SIGTERM"
        assert "\nEnvironment=LEDGER_CONFIG=/etc/tpu-ledger/config.toml\n" in (out / f"tpu-ledger-{service}.service").read_text()
        assert all(s[key] == value for key, value in HARDENING.items()), service
        # A venv under a home directory must stay readable to the service.
        assert s["ProtectHome"] == ("read-only" if str(ledger).startswith(("/home/", "/root/")) else "yes")
    assert "u tpu-lab -" in (out / "tpu-ledger.conf").read_text()
    assert unit(out / "tpu-ledger-backup.timer")["Timer"]["OnCalendar"] == "hourly"
    # Written once: a second run refuses to replace them without --force.
    again = CliRunner().invoke(cli, ["deploy", "systemd", str(out)])
    assert again.exit_code == 2 and "exists" in again.stderr and "--force" in again.stderr


def test_a_broken_unit_is_what_verify_refuses(tmp_path: Path):
    """The check above can fail: verify rejects a unit whose ExecStart is missing."""
    out = tmp_path / "units"
    CliRunner().invoke(cli, ["deploy", "systemd", str(out), "--ledger", str(tmp_path / "no-such-ledger"),
                             "--service", "watch", "--no-backup"])
    done = subprocess.run(["systemd-analyze", "verify", str(out / "tpu-ledger-watch.service")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and "no-such-ledger" in done.stderr


def test_the_example_config_is_accepted_by_every_command(tmp_path: Path):
    out = tmp_path / "units"
    CliRunner().invoke(cli, ["deploy", "systemd", str(out), "--service", "reconcile"])
    example = out / "config.toml.example"
    result = CliRunner().invoke(cli, ["--config", str(example), "config", "--all", "--json"])
    assert result.exit_code == 0, result.output
    assert '"where": "' + str(example) in result.stdout


def test_a_relative_ledger_path_is_refused(tmp_path: Path):
    result = CliRunner().invoke(cli, ["deploy", "systemd", str(tmp_path / "u"), "--ledger", "bin/ledger"])
    assert result.exit_code == 2 and "absolute" in result.stderr
