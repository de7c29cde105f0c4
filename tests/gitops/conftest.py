"""Fixtures for the watcher's tests: real repositories and a real SQLite ledger per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gitops_helpers import Hub

from ledger.store.sqlite import SQLiteStore


@pytest.fixture
def hub(tmp_path: Path) -> Hub:
    return Hub(tmp_path)


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def store(store_url: str) -> Iterator[SQLiteStore]:
    s = SQLiteStore(store_url.removeprefix("sqlite:///"))
    try:
        yield s
    finally:
        s.close()
