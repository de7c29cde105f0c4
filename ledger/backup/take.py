"""`backup(store_url, dest, key, signer)`: a consistent copy of the ledger, and a checkpoint
of its head signed with the reconciler's key, into a new folder (manifest.py's layout).

The folder is written under a temporary name beside DEST and renamed at the end: a backup
interrupted half-way leaves no folder that looks complete.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ledger import __version__
from ledger.backup import postgres, sqlite
from ledger.backup.manifest import CHECKPOINT, FILES, Backend, Manifest, file_digest
from ledger.checkpoints import files
from ledger.checkpoints.note import Signed, sign, utc_seconds
from ledger.checkpoints.sshsig import SigningKey
from ledger.errors import UsageError, safe_url
from ledger.events import GENESIS_HASH
from ledger.store import open_store
from ledger.store.base import FORMAT_VERSION, Reader
from ledger.store.sqlite import PREFIX as SQLITE_PREFIX
from ledger.store.sqlite import SQLiteStore


@dataclass(frozen=True, slots=True)
class Taken:
    folder: Path
    manifest: Manifest
    signed: Signed
    seconds: float


def backend_of(url: str) -> Backend:
    return "sqlite" if url.startswith(SQLITE_PREFIX) else "postgresql"


def _head(store: Reader) -> tuple[int, str]:
    head = store.head()
    return head, (store.hash_at(head) if head else GENESIS_HASH) or GENESIS_HASH


def _fresh(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} exists and is not an empty folder", hint="back up into a new folder, e.g. one named by the date")


def backup(store_url: str, dest: Path, key: SigningKey, signer: str) -> Taken:
    """Copy the ledger at `store_url` into the new folder `dest`, with a signed checkpoint."""
    _fresh(dest)
    started = time.monotonic()
    backend = backend_of(store_url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        copy = work / FILES[backend]
        schema = None
        with contextlib.closing(open_store(store_url, create=False)) as store:
            if backend == "sqlite":
                assert isinstance(store, SQLiteStore)
                sqlite.copy(store.path, copy)
            else:
                # Append-only: the dump, taken after, holds at least this head, unchanged.
                head, head_hash = _head(store)
                schema = postgres.dump(store_url, copy)
        if backend == "sqlite":  # the head of the copy itself
            with contextlib.closing(open_store(f"{SQLITE_PREFIX}{copy}", create=False)) as copied:
                head, head_hash = _head(copied)
            sqlite.settle(copy)
        signed = sign(key, seq=head, hash=head_hash, signer=signer, when=datetime.now(UTC))
        files.write(work / CHECKPOINT, signed)
        size, digest = file_digest(copy)
        manifest = Manifest(backend=backend, file=copy.name, bytes=size, sha256=digest, head=head, head_hash=head_hash,
                            store_format=FORMAT_VERSION, created=utc_seconds(datetime.now(UTC)),
                            source=safe_url(store_url), tool_version=__version__, schema=schema)
        manifest.write(work)
        work.rename(dest)  # replaces an empty folder, refuses a full one
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Taken(dest, manifest, signed, time.monotonic() - started)
