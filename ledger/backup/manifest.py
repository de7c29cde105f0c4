"""What a backup folder holds, written as `manifest.json` beside the copy and its checkpoint.

    DEST/manifest.json          this: the kind of copy, its size and SHA-256, the head it holds
    DEST/ledger.db              an SQLite copy (the online backup API), or
    DEST/ledger.pgdump          a pg_dump archive (custom format) of the ledger's schema
    DEST/checkpoint(.sig)       the signed checkpoint of that head (`ledger checkpoint --out`'s files)

The manifest is not signed: the checkpoint is. The manifest's digest finds a damaged copy
before anything is loaded; the checkpoint proves the restored chain is the one that was
backed up (a copy edited and re-hashed does not match a head the reconciler's key signed).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from ledger.errors import LedgerError

MANIFEST = "manifest.json"
CHECKPOINT = "checkpoint"
FILES = {"sqlite": "ledger.db", "postgresql": "ledger.pgdump"}
LAYOUT_VERSION = 1

Backend = Literal["sqlite", "postgresql"]


@dataclass(frozen=True, slots=True)
class Manifest:
    backend: Backend
    file: str  # the copy's name inside the folder
    bytes: int
    sha256: str
    head: int  # the checkpoint's seq: the copy holds at least this much of the chain
    head_hash: str
    store_format: int  # the on-disk format of the ledger that was copied
    created: str  # UTC, to the second
    source: str  # the store URL, password removed
    tool_version: str
    schema: str | None = None  # PostgreSQL: the schema the dump restores into
    layout: int = LAYOUT_VERSION

    def write(self, folder: Path) -> None:
        (folder / MANIFEST).write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        try:
            data = json.loads(path.read_text())
            manifest = cls(**data)
        except OSError as exc:
            raise LedgerError(f"{folder} is not a tpu-ledger backup: cannot read {MANIFEST} ({exc.strerror})",
                              hint="give the folder `ledger backup DEST` wrote") from exc
        except (ValueError, TypeError) as exc:
            raise LedgerError(f"{path} is damaged: {exc}", hint="use another backup") from exc
        if manifest.layout > LAYOUT_VERSION:
            raise LedgerError(f"{folder} was written by a newer tpu-ledger (backup layout {manifest.layout})",
                              hint="restore it with that version or newer")
        if manifest.backend not in FILES or manifest.file != FILES[manifest.backend]:
            raise LedgerError(f"{path} names an unknown copy {manifest.backend}/{manifest.file}")
        return manifest

    def check_copy(self, folder: Path) -> Path:
        """The copy's path, after checking its size and digest against the manifest."""
        path = folder / self.file
        if not path.is_file():
            raise LedgerError(f"{path} is missing", hint="the backup folder is incomplete")
        size, digest = file_digest(path)
        if (size, digest) != (self.bytes, self.sha256):
            raise LedgerError(f"{path} is damaged: {size} bytes with SHA-256 {digest[:12]}, the manifest says "
                              f"{self.bytes} bytes, {self.sha256[:12]}", hint="use another backup")
        return path


def file_digest(path: Path) -> tuple[int, str]:
    """(size, SHA-256 hex) of a file, read in blocks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()
