"""Where the watcher stands on a branch, folded from its own stream `_git:<branch>`.

The ledger is the only record of progress: every ingested commit leaves an `ingested` note
in the same transaction as its job events, so position and events never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


def stream_for(branch: str) -> str:
    return f"_git:{branch}"


@dataclass(frozen=True, slots=True)
class Position:
    version: int = 0  # of the `_git:<branch>` stream
    commit: str | None = None  # last ingested commit
    governing: dict[str, str] = field(default_factory=dict)  # path -> blob of approved policy files
    rewritten: dict[str, Any] | None = None  # pending history_rewritten data (paused)
    accepted: dict[str, Any] | None = None  # rewrite_accepted not yet followed by an ingest

    @property
    def paused(self) -> bool:
        return self.rewritten is not None and self.accepted is None


def fold_position(events: Iterable[Any]) -> Position:
    """Events of `_git:<branch>` (objects with .type, .data, .version) -> Position."""
    # May start mid-stream (at or before the last `ingested` note): nothing earlier matters.
    version, commit, governing = 0, None, {}
    rewritten: dict[str, Any] | None = None
    accepted: dict[str, Any] | None = None
    for ev in events:
        version = ev.version
        if ev.type == "note" and ev.data.get("kind") == "ingested":
            commit = ev.data["commit"]
            governing = dict(ev.data.get("governing", {}))
            rewritten = accepted = None
        elif ev.type == "history_rewritten":
            rewritten, accepted = dict(ev.data), None
        elif ev.type == "rewrite_accepted" and rewritten is not None:
            accepted = dict(ev.data)
    return Position(version, commit, governing, rewritten, accepted)
