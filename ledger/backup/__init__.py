"""Backups of the ledger: a consistent copy taken while services run, with a checkpoint of
its head signed by the reconciler's key, and a restore that proves what it loaded.

- `manifest`: the backup folder's layout and its manifest (what was copied, size, digest).
- `sqlite`, `postgres`: the copies (SQLite's online backup API; pg_dump and pg_restore).
- `take`: `backup()`, `load`: `restore()` (into an empty ledger only, verified before use).

docs/backup.md is the runbook: what else to keep (the reconciler's key, config, job logs).
"""

from ledger.backup.load import Restored, RestoreFailed, restore
from ledger.backup.manifest import Manifest
from ledger.backup.take import Taken, backup

__all__ = ["Manifest", "RestoreFailed", "Restored", "Taken", "backup", "restore"]
