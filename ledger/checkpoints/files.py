"""Checkpoints as files: what `ledger checkpoint --out` writes and `--from FILE` reads."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from ledger.checkpoints.note import NoteError, Signed
from ledger.errors import LedgerError


def signature_path(path: Path) -> Path:
    """Where the signature of a checkpoint file lives: beside it, as `ssh-keygen -Y sign` puts it."""
    return Path(f"{os.fspath(path)}.sig")


def write(path: Path, signed: Signed) -> None:
    path.write_bytes(signed.body)
    signature_path(path).write_text(signed.signature)


def read(path: Path) -> Iterator[Signed]:
    """A checkpoint file with its `.sig` beside it, or JSON lines of {"checkpoint",
    "signature"} (an archive of the Pub/Sub messages). A line that is not one is passed on
    as an empty checkpoint, which the check reports as unreadable (never skipped)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LedgerError(f"cannot read checkpoints from {path}: {exc.strerror}") from exc
    if data.lstrip()[:1] == b"{":
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                yield Signed.from_json(json.loads(line), f"{path}:{number}")
            except (ValueError, NoteError):
                yield Signed(b"", "", f"{path}:{number}")
        return
    sig = signature_path(path)
    yield Signed(data, sig.read_text("utf-8", "replace") if sig.exists() else "", str(path))
