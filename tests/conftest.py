"""Shared by every test directory; keep it to what more than one part needs.

Markers are assigned here, never by hand: tests/layers.py says which layer and services each
test has, and its Guard fails a test that reaches a service it is not marked for.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from ledger.app import logsetup
from tests.layers import BACKEND_FIXTURES, Guard, classify

REPO_ROOT = Path(__file__).resolve().parent.parent
GUARD = pytest.StashKey[Guard]()


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def ledger_cmd() -> list[str]:
    """argv prefix that runs the CLI from this tree: [python, -m, ledger] (cwd = repo_root)."""
    return [sys.executable, "-m", "ledger"]


@pytest.fixture(autouse=True)
def _command_logging_ends_with_its_test():
    """A command run in-process (click's CliRunner) installs its stderr handler on the root
    logger; left there, a thread another test started logs through it after that test's
    capture ended, and the line lands in the suite's output."""
    yield
    logsetup.remove()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--dump-marks", metavar="PATH", default=None,
                     help="write each collected test's markers as JSON to PATH (tests/test_layers.py)")


def pytest_configure(config: pytest.Config) -> None:
    # `ledger reconcile` collects job logs into the default archive under $HOME unless told
    # otherwise: the tests' reconcilers collect into a folder of the session instead.
    os.environ.setdefault("LEDGER_LOG_ARCHIVE", tempfile.mkdtemp(prefix="tests-job-logs-"))
    guard = Guard()
    guard.install()
    config.stash[GUARD] = guard


def pytest_unconfigure(config: pytest.Config) -> None:
    guard = config.stash.get(GUARD, None)
    if guard is not None:
        guard.close()


def _fixtures_of(item: pytest.Item) -> tuple[set[tuple[str, str]], dict[tuple[str, str], str]]:
    """(where defined, name) of every fixture the test uses, and the param of the backend ones."""
    info = getattr(item, "_fixtureinfo", None)
    fixtures: set[tuple[str, str]] = set()
    params: dict[tuple[str, str], str] = {}
    callspec = getattr(item, "callspec", None)
    if info is not None:
        for name in info.names_closure:
            defs = info.name2fixturedefs.get(name)
            if not defs:
                continue
            key = (defs[-1].baseid, name)
            fixtures.add(key)
            if key in BACKEND_FIXTURES and callspec is not None and name in callspec.params:
                value = callspec.params[name]
                params[key] = str(getattr(value, "name", value))
    return fixtures, params


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    dump = {}
    for item in items:
        fixtures, params = _fixtures_of(item)
        for mark in sorted(classify(item.nodeid.split("::")[0], fixtures, params)):
            item.add_marker(mark)
        dump[item.nodeid] = {"marks": sorted({m.name for m in item.iter_markers()}), "fixtures": sorted(fixtures)}
    path = config.getoption("--dump-marks")
    if path:
        Path(path).write_text(json.dumps(dump, indent=1))


@pytest.fixture
def service_guard(request: pytest.FixtureRequest) -> Guard:
    """The guard itself, for tests/test_layers.py."""
    return request.config.stash[GUARD]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.config.stash[GUARD].begin(item.nodeid, {m.name for m in item.iter_markers()})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    try:
        return (yield)
    finally:
        reached = item.config.stash[GUARD].end()
        if reached:
            pytest.fail(f"{item.nodeid} reached services it has no marker for: {'; '.join(reached)} "
                        "(tests/layers.py assigns markers; tests/README.md explains)", pytrace=False)
