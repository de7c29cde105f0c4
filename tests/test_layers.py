"""The markers are right by construction: tests/layers.py assigns them, the guard enforces them.

A copy of this test tree is collected with a few new tests added, as a contributor would add
them: a test using the `pg_url` fixture comes out `postgres`, one with no service fixture
`unit`, and so on, with nobody writing a marker. Then the guard: a test reaching git, sshd,
the Pub/Sub emulator, the TPU emulator or a `ledger demo` it has no marker for fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from emulator.pubsub import PUBSUB_EMULATOR
from tests.layers import (
    BACKEND_FIXTURES,
    LAYERS,
    PLACES,
    SERVICE_FIXTURES,
    SERVICES,
    ServiceNotMarked,
    classify,
    marker_lines,
)

ROOT = Path(__file__).resolve().parent.parent

NEW_TESTS = {
    "tests/postgres/test_zz_new.py": "def test_pg(pg_url):\n    pass\n\n\ndef test_both(ledger_url):\n    pass\n",
    "tests/remote/test_zz_new.py": "def test_ssh(pod):\n    pass\n",
    "tests/fanout/test_zz_new.py": "def test_pubsub(emulator):\n    pass\n\n\ndef test_plain(store_url):\n    pass\n",
    "tests/reconciler/test_zz_new.py": "def test_reconcile(harness):\n    pass\n",
    "tests/gitops/test_zz_new.py": "def test_git(hub):\n    pass\n",
    "tests/ledger/test_zz_new.py": "def test_contract(store_factory):\n    pass\n\n\ndef test_unit(tmp_path):\n    pass\n",
    "tests/e2e/test_zz_new.py": "def test_story():\n    pass\n",
    "tests/test_zz_new_e2e.py": "def test_story():\n    pass\n",
}
EXPECTED = {
    "tests/postgres/test_zz_new.py::test_pg": {"integration", "postgres"},
    "tests/postgres/test_zz_new.py::test_both[sqlite]": {"contract", "sqlite"},
    "tests/postgres/test_zz_new.py::test_both[postgres]": {"contract", "postgres"},
    "tests/remote/test_zz_new.py::test_ssh": {"integration", "sshd"},
    "tests/fanout/test_zz_new.py::test_pubsub": {"integration", "pubsub"},
    "tests/fanout/test_zz_new.py::test_plain": {"unit"},
    "tests/reconciler/test_zz_new.py::test_reconcile": {"integration", "tpu_emulator"},
    "tests/gitops/test_zz_new.py::test_git": {"integration", "git"},
    "tests/ledger/test_zz_new.py::test_contract[sqlite]": {"contract", "sqlite"},
    "tests/ledger/test_zz_new.py::test_contract[postgres]": {"contract", "postgres"},
    "tests/ledger/test_zz_new.py::test_unit": {"unit"},
    "tests/e2e/test_zz_new.py::test_story": {"e2e"},
    "tests/test_zz_new_e2e.py::test_story": {"e2e"},
}
NAMED = set(LAYERS) | set(SERVICES) | {"sqlite"}


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every test of a copy of this tree plus NEW_TESTS: nodeid -> its markers and fixtures."""
    tree = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "tests", tree / "tests", ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    shutil.copytree(ROOT / "bench", tree / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    for path, text in NEW_TESTS.items():
        (tree / path).write_text(text)
    dump = tree / "marks.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", f"--dump-marks={dump}"],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(dump.read_text())


def test_new_tests_get_their_markers_from_their_fixtures(collected):
    got = {nodeid: set(entry["marks"]) & NAMED for nodeid, entry in collected.items() if nodeid in EXPECTED}
    assert got == EXPECTED


def test_every_test_has_exactly_one_layer(collected):
    wrong = {nodeid: entry["marks"] for nodeid, entry in collected.items() if len(set(entry["marks"]) & set(LAYERS)) != 1}
    assert not wrong


def test_the_tables_name_fixtures_and_places_that_exist(collected):
    used = {tuple(key) for entry in collected.values() for key in entry["fixtures"]}
    stale = (SERVICE_FIXTURES.keys() | BACKEND_FIXTURES.keys()) - used
    assert not stale, f"no test uses these fixtures (renamed or moved?): {sorted(stale)}"
    assert all((ROOT / place).exists() for place in PLACES), [p for p in PLACES if not (ROOT / p).exists()]


def test_pyproject_declares_exactly_the_markers_of_layers_py():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert [line for line in declared if not line.startswith("slow:")] == marker_lines()


def test_classify_layers_and_precedence():
    assert classify("tests/x/test_a.py", set()) == {"unit"}
    assert classify("tests/gitops/test_a.py", {("tests/gitops", "hub")}) == {"integration", "git"}
    assert classify("tests/ledger/test_a.py", {("tests/ledger", "store_factory")},
                    {("tests/ledger", "store_factory"): "postgres"}) == {"contract", "postgres"}
    assert classify("tests/emulator/test_a.py", set()) == {"integration", "tpu_emulator"}
    assert classify("tests/e2e/test_a.py", {("tests/postgres", "pg_admin_url")}) == {"e2e", "postgres"}
    # a fixture of the same name defined elsewhere is a different fixture
    assert classify("tests/x/test_a.py", {("tests/x", "emulator")}) == {"unit"}


# ------------------------------------------------------------------------------ the guard
def test_git_in_this_process_without_the_marker_is_refused(service_guard, tmp_path):
    with service_guard.expect_violation() as caught, pytest.raises(ServiceNotMarked, match="'git' marker"):
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=False)
    assert caught == [f"git: a process `git init -q {tmp_path}`"]
    assert not (tmp_path / ".git").exists()


def test_git_in_a_child_process_without_the_marker_fails_there(service_guard, tmp_path):
    with service_guard.expect_violation() as caught:
        done = subprocess.run(["sh", "-c", "git init -q repo"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 97 and "without the 'git' marker" in done.stderr
    assert caught == ["git: git init -q repo (in a child process)"]
    assert not (tmp_path / "repo").exists()


def test_git_version_is_not_using_git(service_guard):
    with service_guard.expect_violation() as caught:
        subprocess.run(["git", "--version"], capture_output=True, check=True)
    assert caught == []


@pytest.mark.parametrize("argv, service", [
    (["/usr/sbin/sshd", "-t"], "sshd"),
    ([str(PUBSUB_EMULATOR), "--port=1"], "pubsub"),
    ([sys.executable, "-m", "ledger", "demo", "--no-pubsub"], "tpu_emulator"),
    (["ledger", "--store", "postgresql://127.0.0.1/x", "verify"], "postgres"),
])
def test_starting_a_service_process_without_the_marker_is_refused(service_guard, argv, service):
    with service_guard.expect_violation() as caught, pytest.raises(ServiceNotMarked, match=f"'{service}' marker"):
        subprocess.run(argv, capture_output=True)
    assert caught and caught[0].startswith(f"{service}: ")


def test_the_tpu_emulator_without_the_marker_is_refused(service_guard, tmp_path):
    from emulator import Emulator

    with service_guard.expect_violation() as caught, pytest.raises(ServiceNotMarked, match="'tpu_emulator' marker"):
        Emulator(state_dir=tmp_path / "emu").start()
    assert caught == ["tpu_emulator: emulator.Emulator.start"]
    assert not (tmp_path / "emu" / "emulator.json").exists()


def test_a_refused_postgres_connection_is_not_reaching_postgres(service_guard):
    import psycopg

    with service_guard.expect_violation() as caught, pytest.raises(psycopg.OperationalError):
        psycopg.connect("postgresql://nobody@127.0.0.1:1/nothing", connect_timeout=5)
    assert caught == []
