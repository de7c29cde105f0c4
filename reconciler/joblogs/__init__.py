"""Job logs in one place: every attempt's output, from whichever reconciler fetched it.

- `archive`: the interface of the shared place and the default, a directory.
- `gcs`: Cloud Storage, through google-cloud-storage.
- `bounds`: how much of a job is collected (pure).
- `collector`: copies the reconciler's log directory into the archive as it grows.
- `view`: the archive and a local log directory read as one (`ledger logs`, the dashboard).

`open_archive("gs://bucket/prefix")` or `open_archive("/shared/job-logs")` picks one.
"""

from __future__ import annotations

from pathlib import Path

from ledger.errors import UsageError
from reconciler.joblogs.archive import DirArchive, LogArchive
from reconciler.joblogs.bounds import Limits
from reconciler.joblogs.collector import Collector, CollectorThread
from reconciler.joblogs.gcs import GcsArchive
from reconciler.joblogs.view import LogFile, LogView

GCS_SCHEME = "gs://"


def open_archive(where: str | Path, *, project: str | None = None) -> LogArchive:
    """`gs://bucket[/prefix]` (Cloud Storage), else a directory (`file://` optional)."""
    text = str(where)
    if text.startswith(GCS_SCHEME):
        bucket, _, prefix = text.removeprefix(GCS_SCHEME).partition("/")
        if not bucket:
            raise UsageError(f"no bucket in {text!r}", hint="write gs://BUCKET or gs://BUCKET/PREFIX")
        return GcsArchive(bucket, prefix, project=project)
    return DirArchive(Path(text.removeprefix("file://")).expanduser())


__all__ = ["Collector", "CollectorThread", "DirArchive", "GcsArchive", "Limits", "LogArchive", "LogFile", "LogView",
           "open_archive"]
