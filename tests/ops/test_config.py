"""The config file: flag > environment > file > default for every option of every command,
`ledger config` naming where each value came from, unknown keys refused with file:line, the
LEDGER_* inventory, and the generated references being current."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ledger.app import config, reference
from ledger.app.cli import cli

ROOT = Path(__file__).resolve().parents[2]
FILE = """\
store = "sqlite:///{db}"
log_format = "json"     # underscores read as dashes
project = "file-project"

[reconcile]
# a comment
id = "recon-file"
lease-ttl = 7
interval = 3

[dashboard]
root-path = "/tpu"

[emulator.preempt]
rate = 0.5
"""


def has(row: dict, **expected) -> bool:
    return all(row.get(k) == v for k, v in expected.items())


def settings(args: list[str], env: dict[str, str] | None = None) -> dict[tuple[str, str], dict]:
    result = CliRunner(env={"LEDGER_CONFIG": None, **(env or {})}).invoke(cli, [*args])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    return {(r["command"], r["key"]): r for r in data["settings"]} | {("", "file"): {"value": data["file"]}}


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(FILE.format(db=tmp_path / "l.db"))
    return path


def test_flag_over_env_over_file_over_default_with_where_each_came_from(conf: Path):
    rows = settings(["--config", str(conf), "config", "--json", "reconcile"], {"LEDGER_INTERVAL": "5"})
    assert rows[("", "file")]["value"] == str(conf)
    assert has(rows[("reconcile", "id")], value="recon-file", source="file", where=f"{conf}:7")
    assert rows[("reconcile", "lease-ttl")]["value"] == 7.0 and rows[("reconcile", "lease-ttl")]["where"] == f"{conf}:8"
    assert has(rows[("reconcile", "interval")], value=5.0, source="env", where="LEDGER_INTERVAL")
    assert has(rows[("reconcile", "project")], value="file-project", source="file", where=f"{conf}:3")
    assert has(rows[("reconcile", "orphan-grace")], value=300.0, source="default")
    assert has(rows[("(global)", "log-format")], value="json", source="file", where=f"{conf}:2")
    rows = settings(["--config", str(conf), "--log-format", "text", "config", "--json", "reconcile"])
    assert has(rows[("(global)", "log-format")], value="text", source="flag")
    # A subcommand's table, and a setting shared from the top level by every command that has it.
    rows = settings(["--config", str(conf), "config", "--json", "emulator", "preempt"])
    assert rows[("emulator preempt", "rate")]["value"] == 0.5
    assert settings(["--config", str(conf), "config", "--json", "fanout"])[("fanout", "project")]["value"] == "file-project"
    # The global `store` is never another command's `--store` (chaos's is a backend's name).
    assert settings(["--config", str(conf), "config", "--json", "chaos"])[("chaos", "store")]["source"] == "default"


def test_the_file_reaches_the_command_that_runs(conf: Path, tmp_path: Path):
    """Not only `ledger config`: a real command gets its store and options from the file."""
    env = {"LEDGER_CONFIG": str(conf), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "ledger", "verify"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and f"no ledger at {tmp_path / 'l.db'}" in done.stderr  # the file's, not HOME's
    done = subprocess.run([sys.executable, "-m", "ledger", "--store", f"sqlite:///{tmp_path / 'flag.db'}", "verify"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert f"no ledger at {tmp_path / 'flag.db'}" in done.stderr  # the flag over the file


@pytest.mark.parametrize(("text", "line", "key", "hint"), [
    ('store = "x"\n\n[reconcile]\nlease-tll = 3\n', 4, "'lease-tll' in [reconcile]", "did you mean 'lease-ttl'"),
    ('projcet = "x"\n', 1, "'projcet'", "did you mean 'project'"),
    ('[reconciler]\nid = "a"\n', 1, "table (no such command) 'reconciler'", "did you mean 'reconcile'"),
    ('[emulator.preempt]\nrat = 1\n', 2, "'rat' in [emulator.preempt]", "did you mean 'rate'"),
])
def test_an_unknown_key_is_one_line_naming_file_line_and_key(tmp_path: Path, text, line, key, hint):
    path = tmp_path / "c.toml"
    path.write_text(text)
    for args in (["list"], ["reconcile", "--help"], ["config"]):
        result = CliRunner(env={"LEDGER_CONFIG": str(path)}).invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: {path}:{line}: unknown "), result.stderr
        assert key in result.stderr and hint in result.stderr and "docs/config.md" in result.stderr


def test_a_broken_or_missing_file_is_one_line(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text("x = [\n")
    result = CliRunner().invoke(cli, ["--config", str(bad), "list"])
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {bad}: not valid TOML") and "line" in result.stderr
    result = CliRunner(env={"LEDGER_CONFIG": str(tmp_path / "none.toml")}).invoke(cli, ["list"])
    assert result.exit_code == 2 and "does not exist" in result.stderr and "$LEDGER_CONFIG" in result.stderr


def test_the_search_path_user_then_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("LEDGER_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert config.search_path() == [tmp_path / "tpu-ledger" / "config.toml", config.SYSTEM_PATH]
    (tmp_path / "tpu-ledger").mkdir()
    (tmp_path / "tpu-ledger" / "config.toml").write_text('project = "mine"\n')
    assert config.locate(["list"]) == (tmp_path / "tpu-ledger" / "config.toml", "searched")
    other = tmp_path / "other.toml"
    other.write_text("")
    assert config.locate(["--config", str(other), "list"]) == (other, "--config")
    assert config.locate(["--store", "sqlite:///x.db", "--log-level=debug", "--config", str(other), "list"], cli)[0] == other
    assert config.locate(["list", "--config", "x"])[1] == "searched"  # after the command: the command's own


def test_key_lines_follow_tables_dotted_keys_and_multiline_values():
    text = 'a = 1\nb = """\nc = 2\n"""\n[t]\nd = [\n  1,\n]\ne."f" = 3\n[[x]]\ng = 4\n'
    assert config.key_lines(text) == {("a",): 1, ("b",): 2, ("t",): 5, ("t", "d"): 6, ("t", "e", "f"): 9,
                                      ("x",): 10, ("x", "g"): 11}


def test_secrets_and_passwords_are_not_shown():
    assert config.shown("store_url", "postgresql://u:pw@db/l") == "postgresql://u:***@db/l"
    assert config.shown("webhook_secret_file", "/etc/s") == "***"


def test_every_ledger_variable_is_a_setting_or_documented():
    """The inventory: every LEDGER_* name in the code is an option's environment variable,
    an environment-only setting, or what a job's processes see (docs/config.md lists each)."""
    names = set()
    for package in ("ledger", "reconciler", "emulator"):
        for path in (ROOT / package).rglob("*.py"):
            names |= set(re.findall(r"\bLEDGER_[A-Z][A-Z0-9_]*\b", path.read_text()))
    not_variables = {"LEDGER_DIR", "LEDGER_CHECKPOINT"}  # a path constant; the output marker jobs print
    options = set()
    for _, command in config.walk(cli):
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            options |= {envvar} if isinstance(envvar, str) else set(envvar or ())
    documented = options | set(config.ENV_ONLY) | set(config.JOB_ENV) | not_variables
    assert names - documented == set()
    text = (ROOT / "docs" / "config.md").read_text()
    assert all(f"`{name}`" in text for name in documented - not_variables)


def test_the_generated_references_are_current():
    """docs/cli.md, docs/config.md and the settings index: run scripts/cli_reference.py."""
    for name, render in (("docs/cli.md", reference.cli_markdown), ("docs/config.md", reference.config_markdown),
                         (f"ledger/app/{config.INDEX_FILE}", reference.index_json)):
        assert (ROOT / name).read_text() == render(cli), f"{name} is stale: run .venv/bin/python scripts/cli_reference.py"


def test_an_option_the_index_does_not_know_yet_is_still_a_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The index is a cache: a key it lacks is checked against the real commands."""
    monkeypatch.setattr(config, "load_index", lambda: {})
    path = tmp_path / "c.toml"
    path.write_text('verify-every = 60\n[reconcile]\nlease-ttl = 3\n')
    assert config.default_map(config.load(path), cli).get("reconcile")["lease_ttl"] == 3


@pytest.mark.parametrize(("text", "args", "line", "what"), [
    ('[reconcile]\ninterval = "abc"\n', ["reconcile", "--once"], 2, "Invalid value for '--interval'"),
    ('log-level = "loud"\n', ["list"], 1, "Invalid value for '--log-level'"),
])
def test_a_value_an_option_refuses_names_the_line_it_came_from(tmp_path: Path, text, args, line, what):
    path = tmp_path / "c.toml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["--config", str(path), *args])
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {path}:{line}: {what}"), result.stderr
    assert result.stderr.count("\n") == 1


def _commands(group: click.Group, ctx: click.Context) -> list[click.Command]:
    found: list[click.Command] = [group]
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            found += _commands(command, click.Context(command, info_name=name, parent=ctx))
        elif command is not None:
            found.append(command)
    return found


def test_every_example_block_in_a_help_text_is_a_paragraph_of_its_own():
    """click keeps a block's lines as written only when its `\\b` opens a paragraph: after
    prose with no blank line between, `ledger emulator --help` ran its examples into one
    wrapped line."""
    glued = []
    for command in _commands(cli, click.Context(cli, info_name="ledger")):
        for paragraph in (command.help or "").split("\n\n"):
            lines = [line.strip() for line in paragraph.strip("\n").split("\n")]
            if "\b" in lines[1:] and lines[0] != "\b":
                glued.append(f"{command.name}: {lines[0]!r}")
    assert not glued, glued
