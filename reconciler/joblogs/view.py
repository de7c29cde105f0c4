"""Reading collected logs: the archive and the local log directory as one.

`ledger logs` and the dashboard read every place a log may be: the shared archive (every
host's attempts) and, on a reconciler's host, its own log directory (the freshest bytes of
the attempts it runs right now). Both hold the same bytes from the start of each file, so
for each file the longer copy is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reconciler.joblogs.archive import LogArchive
from reconciler.remote.layout import job_rel

OUTPUT = "output"


@dataclass(frozen=True, slots=True)
class LogFile:
    name: str
    size: int
    source: LogArchive
    key: str

    def read(self, offset: int = 0, limit: int | None = None) -> bytes:
        return self.source.read(self.key, offset, limit)


class LogView:
    def __init__(self, sources: Sequence[LogArchive]) -> None:
        self.sources = list(sources)

    @property
    def where(self) -> str:
        return " and ".join(dict.fromkeys(s.where for s in self.sources))

    def files(self, job_id: str) -> dict[int, dict[str, LogFile]]:
        """attempt -> file name -> the longest copy, for every attempt with logs."""
        prefix = job_rel(job_id)
        found: dict[int, dict[str, LogFile]] = {}
        for source in self.sources:
            for key, size in source.sizes(f"{prefix}/").items():
                attempt, _, name = key[len(prefix) + 1:].partition("/")
                if not attempt.isdigit() or len(attempt) > 8 or "/" in name or not name:
                    continue
                files = found.setdefault(int(attempt), {})
                if name not in files or size > files[name].size:
                    files[name] = LogFile(name, size, source, key)
        return dict(sorted(found.items()))

    def attempt(self, job_id: str, attempt: int) -> dict[str, LogFile]:
        return self.files(job_id).get(attempt, {})


def output_name(worker: int) -> str:
    return f"{OUTPUT}_worker_{int(worker)}.log"


def status_name(worker: int) -> str:
    return f"status_worker_{int(worker)}.json"


def setup_names(files: dict[str, LogFile], worker: int) -> list[str]:
    suffix = f"_worker_{int(worker)}.log"
    return sorted(n for n in files if n.endswith(suffix) and not n.startswith(f"{OUTPUT}_"))
