"""Shared by every test directory; keep it to what more than one part needs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def ledger_cmd() -> list[str]:
    """argv prefix that runs the CLI from this tree: [python, -m, ledger] (cwd = repo_root)."""
    return [sys.executable, "-m", "ledger"]
