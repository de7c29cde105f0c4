"""Snapshots hold plain data only: what decodes them, and how decoding many containers runs.

Every kind of snapshot (job states: ledger.snapshots.jobs; usage: ledger.usage.snapshot;
capacity memory: ledger.capacity_snapshot) is a pickle of plain containers (tuples, lists,
dicts, str, bytes), read by an unpickler that refuses every global: nothing in a snapshot
can name code to run.
"""

from __future__ import annotations

import contextlib
import gc
import io
import pickle
import threading
from collections.abc import Iterator
from typing import Any, NoReturn


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> NoReturn:  # noqa: ARG002
        raise pickle.UnpicklingError(f"snapshot refers to {module}.{name}; snapshots hold plain data only")


def load_plain(data: bytes, start: int = 0) -> Any:
    """Unpickle plain containers only (every snapshot kind's decoder uses this), from `start`
    on (past a magic: a slice would copy the whole blob first); raises
    pickle.UnpicklingError on anything that names code."""
    source = io.BytesIO(data)  # shares `data`, no copy
    source.seek(start)
    return _PlainUnpickler(source).load()


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Folding and decoding make no reference cycles but millions of containers, which set
    off collections of the whole heap over and over (the snapshot's 350k containers took
    2.5x as long to load with the collector on). Freed memory is still freed at once.
    Counted across threads (the dashboard folds on several): the collector is back on when
    the last one leaves, as it was when the first came; one thread's exit never turns it on
    under another, nor leaves it off for good."""
    global _gc_holders, _gc_was_on
    with _gc_lock:
        if _gc_holders == 0:
            _gc_was_on = gc.isenabled()
            gc.disable()
        _gc_holders += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holders -= 1
            if _gc_holders == 0 and _gc_was_on:
                gc.enable()


_gc_lock = threading.Lock()
_gc_holders = 0  # threads (or nested calls) inside no_cyclic_gc
_gc_was_on = False

