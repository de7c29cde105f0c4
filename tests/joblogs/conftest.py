"""Fixtures: the project's Cloud Storage emulator, and the logs two reconciler hosts fetched."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.gcs import GcsEmulator
from reconciler.joblogs import Collector
from reconciler.remote.layout import local_attempt_dir

BUCKET = "lab-logs"


@pytest.fixture
def gcs(monkeypatch: pytest.MonkeyPatch) -> Iterator[GcsEmulator]:
    """The emulator with one bucket; STORAGE_EMULATOR_HOST points the official client at it."""
    with GcsEmulator() as emu:
        emu.create_bucket(BUCKET)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.url)
        yield emu


def fetched(log_dir: Path, job: str, attempt: int, name: str, data: bytes) -> Path:
    """A log file as a reconciler's probes leave it in its log directory."""
    path = local_attempt_dir(log_dir, job, attempt) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(data)
    return path


def race(collectors: list[Collector], key: str) -> None:
    """Every collector in a thread of its own, each making passes until its copy of `key` is
    all in the archive (the other may be first, many times in a row)."""
    def drain(c: Collector) -> None:
        local = max(size for k, _, size in c.local_files() if k == key)
        for _ in range(1000):
            c.run_pass()
            if c.archive.sizes(key.rsplit("/", 1)[0] + "/").get(key, 0) >= local:
                return

    threads = [threading.Thread(target=drain, args=(c,)) for c in collectors]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
