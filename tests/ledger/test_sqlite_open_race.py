"""Several openers of a brand-new SQLite ledger at once (a writer and a publisher thread, two
processes started together) all get a working store: none fails with "database is locked"."""

from __future__ import annotations

import threading
from pathlib import Path

from ledger.events import NewEvent
from ledger.store import open_store


def _open_only(url: str, errors: list[Exception]) -> None:
    try:
        open_store(url).close()
    except Exception as exc:  # noqa: BLE001 - the test collects whatever fails
        errors.append(exc)


def _append_some(url: str, errors: list[Exception]) -> None:
    try:
        store = open_store(url)
        for i in range(10):
            store.append("alice/a", [NewEvent("note", {"text": str(i)})])
        store.close()
    except Exception as exc:  # noqa: BLE001
        errors.append(exc)


def test_openers_racing_on_a_new_file_all_succeed(tmp_path: Path):
    for n in range(40):
        url = f"sqlite:///{tmp_path / f'ledger{n}.db'}"
        errors: list[Exception] = []
        threads = [threading.Thread(target=f, args=(url, errors)) for f in (_open_only, _append_some, _open_only, _append_some)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [], f"run {n}: {errors[0]}"
        store = open_store(url)
        assert store.head() == 20
        store.close()
