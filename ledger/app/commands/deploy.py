"""`ledger deploy systemd DIR`: the services' unit files, from the ones shipped in the wheel."""

from __future__ import annotations

import shutil
import string
import sys
from importlib import resources
from pathlib import Path

import click

from ledger import __version__
from ledger.app.config import SYSTEM_PATH
from ledger.errors import UsageError

UNITS = ("watch", "reconcile", "fanout", "notify", "dashboard")
TEMPLATES = "systemd"


def ledger_path() -> Path:
    """This installation's `ledger`: the one beside the running Python (a venv's bin/)."""
    beside = Path(sys.executable).parent / "ledger"
    if beside.is_file():
        return beside
    found = shutil.which("ledger")
    if found is None:
        raise UsageError("cannot find the `ledger` executable", hint="pass --ledger /path/to/venv/bin/ledger")
    return Path(found)


def template(name: str) -> str:
    return resources.files("ledger.resources").joinpath(TEMPLATES, name).read_text()


def render(name: str, values: dict[str, str]) -> str:
    return string.Template(template(name)).substitute(values)


def files_for(services: tuple[str, ...], backup: bool) -> dict[str, str]:
    """What to write: unit name -> the template it comes from."""
    out = {f"tpu-ledger-{s}.service": f"tpu-ledger-{s}.service" for s in services}
    if backup:
        out["tpu-ledger-backup.service"] = "tpu-ledger-backup.service"
        out["tpu-ledger-backup.timer"] = "tpu-ledger-backup.timer"
    out["tpu-ledger.conf"] = "tpu-ledger.sysusers.conf"
    out["config.toml.example"] = "config.toml"
    return out


@click.group("deploy")
def deploy_group() -> None:
    """Write what a host needs to run the services (systemd units)."""


@deploy_group.command("systemd")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--user", default="tpu-ledger", show_default=True,
              help="The services' own system user (tpu-ledger.conf, for /etc/sysusers.d/, creates it).")
@click.option("--group", default=None, help="Their group [default: the user's name].")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=SYSTEM_PATH,
              show_default=True, help="The config file the units give the services (LEDGER_CONFIG).")
@click.option("--ledger", "executable", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The `ledger` to run [default: this installation's, beside its Python].")
@click.option("--service", "services", type=click.Choice(UNITS), multiple=True,
              help="Only these services (repeatable) [default: all of them].")
@click.option("--backup-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("/var/lib/tpu-ledger/backups"), show_default=True,
              help="Where the hourly backup timer's `ledger backup` writes.")
@click.option("--no-backup", is_flag=True, help="No backup service and timer.")
@click.option("--force", is_flag=True, help="Replace files that exist.")
def systemd_cmd(directory: Path, user: str, group: str | None, config_file: Path, executable: Path | None,
                services: tuple[str, ...], backup_dir: Path, no_backup: bool, force: bool) -> None:
    """Write systemd units for the services into DIRECTORY (e.g. /etc/systemd/system).

    One unit per service (tpu-ledger-watch, -reconcile, -fanout, -notify, -dashboard),
    an hourly backup service and timer, tpu-ledger.conf for /etc/sysusers.d/ (the services'
    user) and config.toml.example. Each unit runs this installation's `ledger` as a dedicated
    user with LEDGER_CONFIG set, keeps its state in /var/lib/tpu-ledger, restarts on failure,
    stops with SIGTERM (a service finishes or fences what it is doing), and runs hardened:
    ProtectSystem=strict, ProtectHome, NoNewPrivileges, no capabilities.

    \b
    Then, as root (docs/deploy-one-vm.md):
      ledger deploy systemd /etc/systemd/system
      mv /etc/systemd/system/tpu-ledger.conf /etc/sysusers.d/ && systemd-sysusers
      install -D -m 0644 /etc/systemd/system/config.toml.example /etc/tpu-ledger/config.toml   # edit it
      systemctl daemon-reload && systemctl enable --now tpu-ledger-watch tpu-ledger-reconcile
    """
    ledger = executable if executable is not None else ledger_path()
    if not ledger.is_absolute():
        raise UsageError(f"--ledger {ledger} is not an absolute path", hint="systemd runs absolute paths only")
    paths = (str(ledger), str(config_file), str(backup_dir))
    in_home = any(p.startswith(("/home/", "/root/")) for p in paths)
    values = {
        "ledger": str(ledger), "config": str(config_file), "user": user, "group": group or user,
        "backup_dir": str(backup_dir), "version": __version__,
        # A venv or config below a home directory must stay readable to the service.
        "protect_home": "read-only" if in_home else "yes",
    }
    for name, value in values.items():
        if any(c.isspace() for c in value) or "%" in value or "$" in value:
            raise UsageError(f"{name} {value!r} contains a space, % or $", hint="systemd unit values need plain paths")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for out, source in files_for(services or UNITS, not no_backup).items():
        target = directory / out
        if target.exists() and not force:
            raise UsageError(f"{target} exists", hint="pass --force to replace it")
        target.write_text(render(source, values))
        written.append(target)
    for target in written:
        click.echo(f"wrote {target}")
    click.echo(f"runs {ledger} as {user}, config {config_file}; next: docs/deploy-one-vm.md")
