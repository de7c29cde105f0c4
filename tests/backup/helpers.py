"""A signing key the allowed-signers file trusts, a ledger that keeps growing during a backup,
and the CLI in the test process."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from click.testing import CliRunner, Result

from ledger.app.cli import cli
from ledger.checkpoints import NAMESPACE, AllowedSigners, SigningKey
from ledger.events import NewEvent, actor
from ledger.store import open_store
from reconciler.keys import ensure_key

SIGNER = "recon-a"
OPS = actor("reconciler", SIGNER)


def reconciler_key(folder: Path) -> tuple[Path, Path]:
    """(the reconciler's key, an allowed-signers file that trusts it for checkpoints)."""
    key = folder / "ssh" / "id_ecdsa"
    ensure_key(key)
    allowed = folder / "allowed_signers"
    allowed.write_text(AllowedSigners(()).line_for(SIGNER, SigningKey.load(key).public_key, NAMESPACE) + "\n")
    return key, allowed


def grow(url: str, n: int, stream: str = "_ops") -> int:
    with contextlib.closing(open_store(url)) as store:
        store.append(stream, [NewEvent("note", {"text": f"note {i}"}, OPS) for i in range(n)])
        return store.head()


@contextlib.contextmanager
def writer(url: str) -> Iterator[list[int]]:
    """Appends one event at a time, as a reconciler does, until the block ends; yields the
    heads it reached."""
    heads: list[int] = []
    stop = threading.Event()

    def run() -> None:
        with contextlib.closing(open_store(url)) as store:
            while not stop.is_set():
                heads.append(store.append("_busy", [NewEvent("note", {"text": "busy"}, OPS)]).positions[-1])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while not heads:  # the writer is appending before the block starts
        stop.wait(0.005)
    try:
        yield heads
    finally:
        stop.set()
        thread.join(30)


def ledger(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", url, *args])
