"""`store_factory`: every store contract test runs once per backend in ./backends/."""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import sys
from pathlib import Path

import pytest

from ledger.store import open_store

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))  # bench/workload.py: realistic event shapes


def _backends() -> list:
    from tests.ledger import backends

    found = []
    for info in sorted(pkgutil.iter_modules(backends.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"tests.ledger.backends.{info.name}")
        if hasattr(module, "BACKEND"):
            found.append(module.BACKEND)
    return found


BACKENDS = _backends()


class StoreFactory:
    """Call it for a Store on a new, empty ledger; `reopen(url)` for another handle on one."""

    def __init__(self, backend, tmp_path: Path) -> None:
        self.backend = backend
        self.name = backend.name
        self._tmp = tmp_path
        self._urls: list[str] = []
        self._open: list = []

    def new_url(self) -> str:
        url = self.backend.new_url(self._tmp)
        self._urls.append(url)
        return url

    def __call__(self):
        return self.reopen(self.new_url())

    # A property test opens a store an example, all under one fixture; a failing one reruns
    # hundreds while Hypothesis shrinks it, and PostgreSQL then refused every connection
    # ("too many clients"), hiding the failure. No test holds this many at once.
    KEEP_OPEN = 16

    def reopen(self, url: str):
        store = open_store(url)
        self._open.append(store)
        if len(self._open) > self.KEEP_OPEN:
            with contextlib.suppress(Exception):
                self._open.pop(0).close()
        return store

    def tamper(self, url: str, seq: int, data_json: str) -> None:
        self.backend.tamper(url, seq, data_json)

    def raw_execute(self, url: str, sql: str) -> None:
        self.backend.raw_execute(url, sql)

    def close(self) -> None:
        for store in self._open:
            with contextlib.suppress(Exception):  # teardown must go on
                store.close()
        self.backend.cleanup(self._urls)


@pytest.fixture(params=BACKENDS, ids=lambda b: b.name)
def store_factory(request, tmp_path):
    reason = request.param.skip_reason()
    if reason:
        pytest.skip(reason)
    factory = StoreFactory(request.param, tmp_path)
    try:
        yield factory
    finally:
        factory.close()
