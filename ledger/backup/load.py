"""`restore(folder, target_url, allowed)`: a backup loaded into an empty ledger, then proved.

Refused when the target holds any event. The copy's digest is checked against the manifest
first; after loading, the whole ledger is verified as `ledger verify` does (chain, versions,
schema, transitions) and the backup's signed checkpoint is checked against it: signed by a
key the allowed-signers file trusts, and the restored chain reaches its seq with its hash.

Where it lands:
- SQLite backup into SQLite: the copy is verified in a temporary file beside the target and
  moved into place only when sound; a failed restore leaves the target as it was.
- PostgreSQL backup into PostgreSQL: `pg_restore` in one transaction into a database without
  the ledger's schema (an empty ledger schema is replaced); a restore that then fails
  verification is dropped again.
- Across backends it is refused: restore into the backend the backup came from, then
  `ledger migrate` the restored ledger (the chain is verified at both ends again).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ledger.backup import postgres, sqlite
from ledger.backup.manifest import CHECKPOINT, Manifest
from ledger.backup.take import backend_of
from ledger.checkpoints import files
from ledger.checkpoints.check import Verdict, check
from ledger.checkpoints.signers import AllowedSigners
from ledger.errors import LedgerError, StoreError, UsageError, safe_url
from ledger.store import Store, open_store
from ledger.store.sqlite import PREFIX as SQLITE_PREFIX
from ledger.store.sqlite import path_of
from ledger.verify import Report, verify_store


class RestoreFailed(LedgerError):
    """The backup does not prove itself: nothing was restored."""


@dataclass(frozen=True, slots=True)
class Restored:
    url: str
    manifest: Manifest
    report: Report
    verdict: Verdict
    seconds: float


def _empty_or_absent(url: str) -> bool:
    """True when a ledger exists at `url` with no event, False when none exists; refuses a
    ledger that holds events."""
    if backend_of(url) == "sqlite":
        if not path_of(url).exists():
            return False
    elif not postgres.schema_exists(url):
        return False
    with contextlib.closing(open_store(url, create=False)) as store:
        head = store.head()
    if head:
        raise UsageError(f"{safe_url(url)} is not empty: it holds {head} event(s)",
                         hint="restore into a new ledger (another --store), never over one in use")
    return True


def prove(store: Store, manifest: Manifest, folder: Path, allowed: AllowedSigners) -> tuple[Report, Verdict]:
    """Verify the restored ledger and check the backup's checkpoint against it."""
    report = verify_store(store)
    if report.problem is not None:
        raise RestoreFailed(f"the restored ledger is unsound at seq {report.problem.position}: {report.problem.reason}",
                            hint="nothing was restored; use another backup")
    signed = next(files.read(folder / CHECKPOINT))
    verdict = check(signed, head=report.head, hash_at=store.hash_at, allowed=allowed)
    if not verdict.ok:
        raise RestoreFailed(f"the backup's {verdict.line()}", hint="nothing was restored; use another backup")
    if verdict.checkpoint is not None and verdict.checkpoint.seq != manifest.head:
        raise RestoreFailed(f"the manifest says head {manifest.head}, the signed checkpoint seq {verdict.checkpoint.seq}",
                            hint="nothing was restored; use another backup")
    return report, verdict


def restore(folder: Path, target_url: str, allowed: AllowedSigners) -> Restored:
    started = time.monotonic()
    manifest = Manifest.read(folder)
    copy = manifest.check_copy(folder)
    target = backend_of(target_url)
    if manifest.backend != target:
        raise UsageError(f"this backup is of a {manifest.backend} ledger and restores into {manifest.backend} only",
                         hint=f"restore it into a {manifest.backend} store, then `ledger migrate` it to {target}")
    exists = _empty_or_absent(target_url)
    if target == "sqlite":
        report, verdict = _sqlite_into_sqlite(copy, manifest, folder, target_url, exists, allowed)
    else:
        report, verdict = _postgres_into_postgres(copy, manifest, folder, target_url, exists, allowed)
    return Restored(safe_url(target_url), manifest, report, verdict, time.monotonic() - started)


def _sqlite_into_sqlite(copy: Path, manifest: Manifest, folder: Path, target_url: str, exists: bool,
                        allowed: AllowedSigners) -> tuple[Report, Verdict]:
    path = path_of(target_url)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.restore.", dir=path.parent)
    os.close(fd)
    staged = Path(name)
    try:
        shutil.copyfile(copy, staged)
        with contextlib.closing(open_store(f"{SQLITE_PREFIX}{staged}", create=False)) as store:
            proved = prove(store, manifest, folder, allowed)
        if exists:  # an empty ledger a service may hold open: loaded in place, atomically
            sqlite.load(staged, path)
        else:
            os.replace(staged, path)
        return proved
    finally:
        for leftover in (staged, Path(f"{staged}-wal"), Path(f"{staged}-shm")):
            leftover.unlink(missing_ok=True)


def _postgres_into_postgres(copy: Path, manifest: Manifest, folder: Path, target_url: str, exists: bool,
                            allowed: AllowedSigners) -> tuple[Report, Verdict]:
    schema = postgres.schema_of(target_url)
    if manifest.schema != schema:
        raise UsageError(f"the dump holds the ledger schema {manifest.schema!r}, the target names {schema!r}",
                         hint=f"restore into a URL ending ?schema={manifest.schema} (pg_restore keeps schema names)")
    if exists:
        postgres.drop_schema(target_url)
    postgres.restore(copy, target_url)
    try:
        with contextlib.closing(open_store(target_url, create=False)) as store:
            return prove(store, manifest, folder, allowed)
    except (RestoreFailed, StoreError):
        postgres.drop_schema(target_url)  # ours: restored a moment ago, and unsound
        raise
