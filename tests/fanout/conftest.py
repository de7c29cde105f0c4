"""Fixtures: the official Pub/Sub emulator in its own process group, real SQLite stores."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.pubsub import PUBSUB_EMULATOR as EMULATOR
from emulator.pubsub import PubSubEmulator

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PubSubEmulator]:
    if not EMULATOR.exists():
        pytest.fail(f"the official Pub/Sub emulator is not installed at {EMULATOR}")
    emu = PubSubEmulator(tmp_path_factory.mktemp("pubsub-emulator") / "emulator.log")
    emu.start()
    previous = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = emu.endpoint
    try:
        yield emu
    finally:
        emu.stop()
        if previous is None:
            os.environ.pop("PUBSUB_EMULATOR_HOST", None)
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = previous


@pytest.fixture
def names() -> tuple[str, str]:
    """A fresh topic and subscription per test: tests share one emulator."""
    suffix = uuid.uuid4().hex[:8]
    return f"t-{suffix}", f"s-{suffix}"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"
