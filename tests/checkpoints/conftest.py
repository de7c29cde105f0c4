"""Fixtures: the reconciler's real key (made as `ledger reconcile` makes it), a SQLite
ledger, and a bare jobs hub that trusts the key (git)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.keys import ensure_key
from tests.checkpoints.helpers import append_notes, make_hub


@pytest.fixture
def signing_key(tmp_path: Path) -> Path:
    path = tmp_path / "ssh" / "id_ecdsa"
    ensure_key(path)
    return path


@pytest.fixture
def ledger_file(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    append_notes(path, 6)
    return path


@pytest.fixture
def checkpoint_hub(tmp_path: Path, signing_key: Path) -> Path:
    return make_hub(tmp_path, signing_key)
