"""The `ledger` command line: the root group, its global options, and one-line errors.

Subcommands live in `ledger/app/commands/` and are loaded on demand (see its `COMMANDS`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import io
import sys
from typing import Any

import click

from ledger import __version__, defaults
from ledger.app import config, logsetup
from ledger.app.commands import COMMANDS
from ledger.errors import LedgerError, database_error

STORE_OPTION_HELP = "Ledger store URL: sqlite:///path or postgresql://... [env: LEDGER_STORE]"


class LedgerGroup(click.Group):
    """Turns LedgerError into one line on stderr and its exit code: never a traceback.

    A database failure met anywhere in a command (a damaged SQLite file read half-way, a
    lost PostgreSQL connection) becomes such a line here, once for every command."""

    def invoke(self, ctx: click.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except LedgerError as exc:
            self._fail(ctx, exc)
        except click.BadParameter as exc:  # a value from the config file: say where it was written
            raise config.bad_value(exc) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except Exception as exc:
            error = database_error(exc, (ctx.obj or {}).get("store_url") or defaults.store_url())
            if error is None:
                raise
            self._fail(ctx, error)

    @staticmethod
    def _fail(ctx: click.Context, exc: LedgerError) -> None:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(exc.exit_code)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra) -> click.Context:  # noqa: ANN003
        """The root context gets the config file as click's default_map: flag > env > file > default."""
        if parent is None and "default_map" not in extra:
            path, how = config.locate(args, self)
            extra["default_map"] = config.default_map(config.load(path, how), self)
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.BadParameter as exc:  # a global option's value in the config file
            raise config.bad_value(exc) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        where = COMMANDS.get(name)
        if where is None:
            return None
        module, _, attr = where.partition(":")
        return getattr(importlib.import_module(f"ledger.app.commands.{module}"), attr)


@click.group(cls=LedgerGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ledger")
@click.option("--store", envvar="LEDGER_STORE", default=None, metavar="URL", help=STORE_OPTION_HELP)
@click.option("--config", "config_path", envvar=config.CONFIG_ENV, default=None, metavar="PATH",
              type=click.Path(dir_okay=False),
              help="The config file (TOML) every option can be set in; flags and environment variables "
                   "override it [env: LEDGER_CONFIG; default: the first of ~/.config/tpu-ledger/config.toml, "
                   "/etc/tpu-ledger/config.toml]. `ledger config` shows what is in force and why.")
@click.option("--log-format", type=click.Choice(logsetup.FORMATS), envvar="LEDGER_LOG_FORMAT", default="text",
              show_default=True, help="Log lines on stderr: text, or one JSON object per line "
                                      "(time, level, component, job, attempt, message) [env: LEDGER_LOG_FORMAT].")
@click.option("--log-level", type=click.Choice(logsetup.LEVELS, case_sensitive=False), envvar="LEDGER_LOG_LEVEL",
              default="info", show_default=True, help="The least severe level logged [env: LEDGER_LOG_LEVEL].")
@click.pass_context
def cli(ctx: click.Context, store: str | None, config_path: str | None, log_format: str, log_level: str) -> None:
    """tpu-ledger: GitOps, event-sourced jobs on Cloud TPUs.

    Users commit job specs to a jobs repository; a merge to the protected branch approves
    them. `ledger watch` turns commits into events, `ledger reconcile` acts on them, and
    every step lands in an append-only, hash-chained ledger that `ledger inspect`,
    `ledger replay` and `ledger verify` explain.

    Tables are boxed on a terminal; to a pipe, or past 500 rows, they are plain
    columns, one line a row (for grep and sort). --json is the form for scripts.
    """
    # A crash inside a native library (gRPC, libpq, OpenSSL) kills a service with no word;
    # this prints every thread's Python stack to stderr (the service's log) first. (A stderr
    # captured in memory, as click's test runner does, has no descriptor to write to.)
    with contextlib.suppress(io.UnsupportedOperation, ValueError):
        faulthandler.enable()
    ctx.ensure_object(dict)
    ctx.obj["store_url"] = store
    logsetup.setup(log_format, log_level.lower(), component=ctx.invoked_subcommand or "ledger")


def main() -> None:
    cli(prog_name="ledger")


if __name__ == "__main__":  # pragma: no cover
    main()
    sys.exit(0)
