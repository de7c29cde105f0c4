"""Where job output is collected: the interface, and the default, a directory.

A key is a log file's path relative to a log directory, `<job>/<attempt>/<file>`, the job id
escaped as `reconciler.remote.layout` escapes it, so the reconciler's own log directory and
the collected copy use the same names. An output file only grows: `append(key, offset,
data)` adds bytes at `offset` and refuses (False) when the stored object is not exactly
`offset` bytes long, so two reconcilers collecting the same attempt (after a takeover) never
store a byte twice. Small files that are replaced whole (a worker's final status) are `put`.

`DirArchive` is the default: a directory on this host, or one every reconciler mounts (NFS,
a shared disk). Appends take an exclusive `flock` on the file while they check its length.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path
from typing import Protocol

from ledger.errors import UsageError


class LogArchive(Protocol):
    where: str  # for messages: the directory, or gs://bucket/prefix

    def sizes(self, prefix: str) -> dict[str, int]:
        """Every key under `prefix` (a `<job>/` or `<job>/<attempt>/` folder, "" = all) and its size."""
        ...

    def append(self, key: str, offset: int, data: bytes) -> bool:
        """Add `data` at `offset`; False (nothing written) when the object's size is not `offset`."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Replace the object with `data`."""
        ...

    def read(self, key: str, offset: int = 0, limit: int | None = None) -> bytes:
        """Up to `limit` bytes from `offset` (b"" past the end or for a missing key)."""
        ...


def check_key(key: str) -> str:
    """A key as the collector makes them: relative, no empty, `.` or `..` segment."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise UsageError(f"bad log key {key!r}")
    return key


class DirArchive:
    """Keys as files under `root` (the layout of the reconciler's own log directory)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.where = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def sizes(self, prefix: str) -> dict[str, int]:
        base = self.root.joinpath(*prefix.strip("/").split("/")) if prefix.strip("/") else self.root
        found: dict[str, int] = {}
        for folder, dirs, names in os.walk(base):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            rel = Path(folder).relative_to(self.root).as_posix()
            for name in names:
                if name.startswith("."):  # a file being written (put's temporary)
                    continue
                with contextlib.suppress(FileNotFoundError):
                    found[f"{rel}/{name}" if rel != "." else name] = os.stat(os.path.join(folder, name)).st_size
        return found

    def append(self, key: str, offset: int, data: bytes) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            if os.fstat(f.fileno()).st_size != offset:
                return False
            f.write(data)
        return True

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def read(self, key: str, offset: int = 0, limit: int | None = None) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(offset)
                return f.read() if limit is None else f.read(limit)
        except (FileNotFoundError, NotADirectoryError):
            return b""
