"""`ledger config`: the settings in force for each command, and where each came from."""

from __future__ import annotations

from typing import Any

import click

from ledger.app import config
from ledger.app.commands.common import print_json
from ledger.errors import UsageError

# The long-running services: what `ledger config` shows when no command is named.
SERVICES = ("watch", "reconcile", "fanout", "notify", "dashboard")


def _settings_of(root: click.Context, path: tuple[str, ...]) -> list[dict[str, Any]]:
    """The options of the command at `path` as it would run now, with no flag of its own."""
    ctx = root
    for name in path:
        command = config.subcommand(ctx.command, name)
        if command is None:
            raise UsageError(f"no command {' '.join(path)!r}", hint="`ledger --help` lists them")
        ctx = command.make_context(name, [], parent=ctx, resilient_parsing=True)
    return [{"command": " ".join(path) or "(global)", **row} for row in config.sources(ctx)]


@click.command("config")
@click.argument("commands", nargs=-1, metavar="[COMMAND]...")
@click.option("--all", "every", is_flag=True, help="Every command's settings, not only the services'.")
@click.option("--json", "as_json", is_flag=True, help="The file and every setting as JSON.")
@click.pass_context
def config_cmd(ctx: click.Context, commands: tuple[str, ...], every: bool, as_json: bool) -> None:
    """Show the settings in force and where each came from: flag, env, file:line or default.

    Every option of every command is a setting. Precedence: a flag, then its environment
    variable, then the config file, then the default. The file is TOML: global options and
    keys every command shares at the top, one [COMMAND] table per command, keys named as
    the long flags (docs/config.md lists them all):

    \b
      store = "sqlite:////var/lib/tpu-ledger/ledger.db"
      log-format = "json"
      project = "my-lab"           # every command with --project
      [reconcile]
      id = "recon-a"
      lease-ttl = 15

    It is the first of: --config PATH or $LEDGER_CONFIG, ~/.config/tpu-ledger/config.toml
    ($XDG_CONFIG_HOME), /etc/tpu-ledger/config.toml. An unknown key is refused by every
    command, with the file, line and key. Values of secrets and URL passwords are hidden.

    \b
    Examples:
      ledger config                         # global options and the services' settings
      ledger config reconcile               # one command's
      ledger --config /etc/tpu-ledger/config.toml config --json
      ledger config emulator preempt        # a subcommand's
    """
    root = ctx.find_root()
    defaults = root.default_map if isinstance(root.default_map, config.Defaults) else None
    file = defaults.config if defaults is not None else config.ConfigFile()
    if every:
        paths = [p for p, _ in config.walk(root.command) if p]
    elif commands:
        paths = [tuple(commands)]
    else:
        paths = [(name,) for name in SERVICES]
    rows = [*_settings_of(root, ()), *(row for path in paths for row in _settings_of(root, path))]
    rows = [r for r in rows if r["key"] not in ("config",) or r["command"] != "(global)"]
    summary = {"file": str(file.path) if file.path else None, "found_by": file.how,
               "searched": [str(p) for p in config.search_path()], "settings": rows}
    if as_json:
        print_json(summary)
        return
    if file.path:
        click.echo(f"config file: {file.path} (from {file.how})")
    else:
        click.echo(f"config file: none (looked for {', '.join(summary['searched'])}; --config or {config.CONFIG_ENV} names one)")
    width = max(len(f"{r['command']} {r['key']}") for r in rows)
    for r in rows:
        where = f" {r['where']}" if r["where"] else ""
        value = "(unset)" if r["value"] is None else r["value"]
        click.echo(f"{(r['command'] + ' ' + r['key']).ljust(width)}  {value}  [{r['source']}{where}]")
