"""One config file for every `ledger` command (TOML), under flags and environment variables.

Precedence, for every option of every command: a flag, then its environment variable, then
the file, then the option's default. The file becomes click's `default_map`, so any option
a command has (today's and tomorrow's) is a setting with no code of its own:

    store = "postgresql://ledger@db.lab.internal/ledger"   # a global option
    log-format = "json"
    project = "my-lab"          # any command's option, for every command that has it
    topic = "ledger-events"

    [reconcile]                 # one command's options: its flags' long names
    id = "recon-a"
    lease-ttl = 15

    [emulator.preempt]          # a subcommand of a group

Keys are the flags' long names (`lease-ttl`; `lease_ttl` reads the same). A section's key
wins over a top-level one. The file is the first of: `--config PATH` / `$LEDGER_CONFIG`,
`$XDG_CONFIG_HOME/tpu-ledger/config.toml` (`~/.config/...`), `/etc/tpu-ledger/config.toml`.
An unknown key or section is an error naming the file, the line and the key.

Which keys exist is read from the commands themselves: the invoked command's section from
the command, the rest from `settings.json` beside this module (generated with docs/cli.md
by scripts/cli_reference.py), a key missing from that index being checked against the real
commands before it is refused (so an option added since the index was made still works).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import click

from ledger.errors import safe_url

CONFIG_ENV = "LEDGER_CONFIG"
SYSTEM_PATH = Path("/etc/tpu-ledger/config.toml")
INDEX_FILE = "settings.json"
Path_ = tuple[str, ...]  # a command's path below `ledger`: () is the root, ("emulator", "preempt")


# Read from the environment only, never from the file: secrets (a config file is often
# world-readable and copied around), and hooks for tests. docs/config.md lists them.
ENV_ONLY = {
    "LEDGER_FORGE_TOKEN": "the forge's API token for `watch`/`ingest --forge` (or --forge-token-file)",
    "LEDGER_WEBHOOK_SECRET": "the webhook's shared secret for `watch --webhook-listen` (or --webhook-secret-file)",
    "LEDGER_CACHE_DIR": "mirrors of remote jobs repositories go to $LEDGER_CACHE_DIR/mirrors (or --cache-dir DIR)",
    "PUBSUB_EMULATOR_HOST": "the Pub/Sub client's own variable: host:port of the Pub/Sub emulator",
    "XDG_DATA_HOME": "the base of every default path: $XDG_DATA_HOME/tpu-ledger (the units set /var/lib)",
    "XDG_CONFIG_HOME": "where the user's config file is looked for: $XDG_CONFIG_HOME/tpu-ledger/config.toml",
    "LEDGER_FAULT_CRASH": "tests and `ledger chaos` only: the reconciler kills itself at these points",
}
# What the reconciler sets for a job's own processes on its TPU hosts: not settings.
JOB_ENV = {
    "LEDGER_JOB_ID": "the job's id, <owner>/<name>",
    "LEDGER_ATTEMPT": "the attempt number (1, then 2 after a recovery, ...)",
    "LEDGER_WORKER_ID": "this host's worker number",
    "LEDGER_WORKDIR": "the job's working directory on the host",
    "LEDGER_ATTEMPT_DIR": "this attempt's directory on the host",
    "LEDGER_ACCELERATOR": "the accelerator it was placed on",
    "LEDGER_ZONE": "the zone it was placed in",
    "LEDGER_PRICING": "spot, preemptible or on-demand",
    "LEDGER_CHIPS": "the chips it holds",
    "LEDGER_PLACEMENT": "which of the spec's choices it runs on",
    "LEDGER_SLICE_ID": "this host's slice (multislice)",
    "LEDGER_NUM_SLICES": "the job's slices (multislice)",
}


def user_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tpu-ledger" / "config.toml"


def search_path() -> list[Path]:
    """Where a config file is looked for when neither --config nor LEDGER_CONFIG names one."""
    return [user_path(), SYSTEM_PATH]


class ConfigError(click.ClickException):
    """A config file that cannot be used: one line, exit 2, before any command runs."""

    exit_code = 2

    def show(self, file: Any = None) -> None:  # noqa: ARG002 - click's signature
        click.echo(f"error: {self.message}", err=True)


# -- reading the file ------------------------------------------------------------------------

_BARE = r"[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*'"
_KEY = re.compile(rf"^((?:{_BARE})(?:\s*\.\s*(?:{_BARE}))*)\s*=(.*)$")
_TABLE = re.compile(r"^\[\[?\s*([^\[\]]+?)\s*\]\]?\s*(?:#.*)?$")
_STRINGS = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'")


def _split_key(text: str) -> Path_:
    return tuple(part.strip().strip("\"'") for part in re.findall(rf"{_BARE}", text))


def key_lines(text: str) -> dict[Path_, int]:
    """The line of every key and table header: tomllib keeps none, and an error must name one."""
    out: dict[Path_, int] = {}
    table: Path_ = ()
    depth = 0
    multiline: str | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if multiline is not None:
            if multiline in line:
                multiline = None
            continue
        if depth > 0:
            plain = _STRINGS.sub("", line)
            depth += plain.count("[") - plain.count("]")
            continue
        if not line or line.startswith("#"):
            continue
        if match := _TABLE.match(line):
            table = _split_key(match.group(1))
            out.setdefault(table, number)
            continue
        if match := _KEY.match(line):
            out.setdefault(table + _split_key(match.group(1)), number)
            rest = match.group(2).strip()
            for quote in ('"""', "'''"):
                if rest.startswith(quote) and rest.count(quote) == 1:
                    multiline = quote
            plain = _STRINGS.sub("", rest)
            depth = max(0, plain.count("[") - plain.count("]"))
    return out


def norm(key: str) -> str:
    return key.replace("_", "-")


@dataclass
class ConfigFile:
    """The settings of one file: top-level keys and one table per command path."""

    path: Path | None = None
    top: dict[str, Any] = field(default_factory=dict)  # normalised key -> value
    sections: dict[Path_, dict[str, Any]] = field(default_factory=dict)
    lines: dict[Path_, int] = field(default_factory=dict)  # (section..., key) -> line, normalised
    how: str = "none"  # how the file was found: "--config", "$LEDGER_CONFIG", "searched"

    def where(self, section: Path_, key: str | None = None) -> str:
        line = self.lines.get(section + ((key,) if key else ()))
        return f"{self.path}:{line}" if line else str(self.path)

    def value(self, section: Path_, key: str) -> tuple[Any, Path_] | None:
        """The file's value of `key` for the command at `section`: its table's, else the top level's."""
        if section and key in self.sections.get(section, {}):
            return self.sections[section][key], section
        if key in self.top:
            return self.top[key], ()
        return None


def valued(command: click.Command) -> set[str]:
    """A command's options that take a value (`--store URL`), as written on the command line."""
    return {o for p in command.params if isinstance(p, click.Option) and not p.is_flag and not p.count for o in p.opts}


def locate(args: list[str], root: click.Command | None = None) -> tuple[Path | None, str]:
    """The config file of this run, and how it was named. `--config` among the global options
    (before the command's name) wins over $LEDGER_CONFIG; a named file must exist."""
    takes_value = valued(root) if root is not None else set()
    named, how = None, ""
    i = 0
    while i < len(args) and args[i] != "--":
        arg = args[i]
        if arg == "--config" and i + 1 < len(args):
            named, how = args[i + 1], "--config"
            break
        if arg.startswith("--config="):
            named, how = arg.partition("=")[2], "--config"
            break
        if not arg.startswith("-"):
            break  # the command's name: what follows is its own
        i += 2 if arg in takes_value else 1
    if named is None and os.environ.get(CONFIG_ENV):
        named, how = os.environ[CONFIG_ENV], f"${CONFIG_ENV}"
    if named is not None:
        path = Path(named).expanduser()
        if not path.is_file():
            raise ConfigError(f"the config file {path} (from {how}) does not exist; "
                              f"create it, or name another with --config PATH or {CONFIG_ENV}")
        return path, how
    for path in search_path():
        if path.is_file():
            return path, "searched"
    return None, "none"


def load(path: Path | None, how: str = "--config") -> ConfigFile:
    if path is None:
        return ConfigFile()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror}; check its path and mode") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}; fix that line (https://toml.io)") from None
    raw_lines = key_lines(text)
    config = ConfigFile(path=path, how=how,
                        lines={tuple(norm(k) for k in key): n for key, n in raw_lines.items()})
    _gather(config, data, ())
    return config


def _gather(config: ConfigFile, table: dict[str, Any], section: Path_) -> None:
    for key, value in table.items():
        name = norm(key)
        if isinstance(value, dict):
            _gather(config, value, (*section, name))
        elif section:
            config.sections.setdefault(section, {})[name] = value
        else:
            config.top[name] = value
    if section and section not in config.sections and not table:
        config.sections[section] = {}


# -- which keys exist --------------------------------------------------------------------------

def option_names(command: click.Command) -> dict[str, str]:
    """A command's settings: each option's long flag name (without --) -> its parameter name."""
    out: dict[str, str] = {}
    for param in command.params:
        if not isinstance(param, click.Option) or not param.expose_value or param.name is None:
            continue
        for opt in param.opts:
            if opt.startswith("--"):
                out[opt[2:]] = param.name
    return out


def subcommand(group: click.Command, name: str) -> click.Command | None:
    if not isinstance(group, click.Group):
        return None
    return group.get_command(click.Context(group), name)


def command_at(root: click.Command, path: Path_) -> click.Command | None:
    command: click.Command | None = root
    for name in path:
        command = subcommand(command, name) if command is not None else None
    return command


def walk(root: click.Command, path: Path_ = ()) -> Iterator[tuple[Path_, click.Command]]:
    """Every command below `root` (loading every command module: slow, for docs and checks)."""
    yield path, root
    if isinstance(root, click.Group):
        ctx = click.Context(root)
        for name in root.list_commands(ctx):
            command = root.get_command(ctx, name)
            if command is not None:
                yield from walk(command, (*path, name))


def build_index(root: click.Command) -> dict[str, list[str]]:
    """Every command's settings, for settings.json (scripts/cli_reference.py writes it)."""
    return {" ".join(path): sorted(option_names(command)) for path, command in walk(root)}


def load_index() -> dict[Path_, set[str]]:
    try:
        text = resources.files("ledger.app").joinpath(INDEX_FILE).read_text()
    except (FileNotFoundError, OSError):
        return {}
    return {tuple(key.split()) if key else (): set(names) for key, names in json.loads(text).items()}


class Catalogue:
    """Which sections and keys exist: from the index, confirmed by the real commands when
    the index does not know a key (it may predate an option)."""

    def __init__(self, root: click.Command) -> None:
        self.root = root
        self.index = load_index()
        self._loaded: dict[Path_, dict[str, str] | None] = {}
        self._all = False

    def names(self, path: Path_) -> dict[str, str] | None:
        """The real command's settings at `path` (None: no such command)."""
        if path not in self._loaded:
            command = command_at(self.root, path)
            self._loaded[path] = option_names(command) if command is not None else None
        return self._loaded[path]

    def is_command(self, path: Path_) -> bool:
        return path in self.index or self.names(path) is not None

    def has(self, path: Path_, key: str) -> bool:
        if key in self.index.get(path, ()):
            return True
        names = self.names(path)
        return names is not None and key in names

    def anywhere(self, key: str) -> bool:
        if any(key in names for names in self.index.values()):
            return True
        if not self._all:
            for path, command in walk(self.root):
                self._loaded[path] = option_names(command)
            self._all = True
        return any(names and key in names for names in self._loaded.values())

    def known(self, path: Path_) -> list[str]:
        return sorted(set(self.index.get(path, ())) | set(self.names(path) or {}))


def _unknown(config: ConfigFile, section: Path_, key: str, choices: Iterable[str], what: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(choices), n=1)
    where = f" in [{'.'.join(section)}]" if section else ""
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(f"{config.where(section, key)}: unknown {what} {key!r}{where}; {hint}remove it, or see "
                       f"`ledger config --help` and docs/config.md for every setting")


def check(config: ConfigFile, catalogue: Catalogue) -> None:
    """Refuse a key or section no command knows, naming the file, the line and the key."""
    if config.path is None:
        return
    for key in config.top:
        if not catalogue.has((), key) and not catalogue.anywhere(key):
            raise _unknown(config, (), key, {k for names in catalogue.index.values() for k in names}, "setting")
    for section, values in config.sections.items():
        if not catalogue.is_command(section):
            parent = section[:-1]
            choices = [p[-1] for p in catalogue.index if p[:-1] == parent and p]
            raise _unknown(config, parent, section[-1], choices, "table (no such command)")
        for key in values:
            if not catalogue.has(section, key):
                raise _unknown(config, section, key, catalogue.known(section), "setting")


# -- click's default_map ----------------------------------------------------------------------

class Defaults(dict):
    """click's `default_map` of one command, made from the file: its options' values by
    parameter name, and, when click asks for a subcommand's map, that subcommand's."""

    def __init__(self, config: ConfigFile, command: click.Command, path: Path_ = (),
                 global_keys: frozenset[str] | None = None) -> None:
        super().__init__()
        self.config = config
        self.command = command
        self.path = path
        # The global options' keys are the root's own: `store` at the top is never `chaos --store`.
        self.global_keys = frozenset(option_names(command)) if global_keys is None else global_keys
        self.origin: dict[str, str] = {}  # parameter name -> "file:line"
        for flag, param in option_names(command).items():
            found = config.value(path, flag)
            if found is not None and path and not found[1] and flag in self.global_keys:
                continue
            if found is not None and param not in self:
                self[param] = found[0]
                self.origin[param] = config.where(found[1], flag)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        if key in self:
            return self[key]
        sub = subcommand(self.command, key)
        if sub is None:
            return default
        return Defaults(self.config, sub, (*self.path, key), self.global_keys)


def default_map(config: ConfigFile, root: click.Command) -> Defaults:
    check(config, Catalogue(root))
    return Defaults(config, root)


# -- where each value came from (`ledger config`) ---------------------------------------------

def bad_value(exc: click.BadParameter) -> click.ClickException:
    """An option's refusal of a value: naming the file and line when the file gave it."""
    where = origin_of(exc.ctx, exc.param)
    if where is None:
        return exc
    return ConfigError(f"{where}: {exc.format_message().rstrip('.')}; fix that line")


def origin_of(ctx: click.Context | None, param: click.Parameter | None) -> str | None:
    """"FILE:LINE" when `param`'s value in `ctx` came from the config file, else None."""
    if ctx is None or param is None or param.name is None:
        return None
    if ctx.get_parameter_source(param.name) is not click.core.ParameterSource.DEFAULT_MAP:
        return None
    defaults = ctx.default_map
    return defaults.origin.get(param.name) if isinstance(defaults, Defaults) else None


SECRET_WORDS = ("secret", "token", "password")


def shown(name: str, value: Any) -> Any:
    """A value as `ledger config` shows it: no password of a URL, no secret."""
    if value is None:
        return None
    if any(word in name for word in SECRET_WORDS):
        return "***"
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [shown(name, v) for v in value]
    if isinstance(value, str) and "://" in value:
        return safe_url(value)
    return value


def sources(ctx: click.Context) -> list[dict[str, Any]]:
    """Each option of `ctx`'s command: its value and where it came from (flag, env, file, default)."""
    rows = []
    defaults = ctx.default_map if isinstance(ctx.default_map, Defaults) else None
    for flag, name in option_names(ctx.command).items():
        param = next(p for p in ctx.command.params if p.name == name)
        if flag != next(o[2:] for o in param.opts if o.startswith("--")):
            continue  # one row per option, under its first long name
        source = ctx.get_parameter_source(name)
        kind = source.name.lower() if source is not None else "default"
        where = ""
        if kind == "commandline":
            kind = "flag"
        elif kind == "environment":
            kind, envvar = "env", param.envvar
            where = next((e for e in ([envvar] if isinstance(envvar, str) else envvar or []) if os.environ.get(e)), "")
        elif kind == "default_map":
            kind, where = "file", defaults.origin.get(name, "") if defaults else ""
        envvar = param.envvar if isinstance(param.envvar, str) else ", ".join(param.envvar or [])
        rows.append({"key": flag, "value": shown(name, ctx.params.get(name)), "source": kind, "where": where,
                     "env": envvar or None})
    return rows
