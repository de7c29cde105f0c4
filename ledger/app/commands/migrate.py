"""`ledger migrate`: copy a ledger to another store (SQLite to PostgreSQL, or back), envelopes
as they are, with the hash chain verified on both ends.

Resumable: a destination that already holds a prefix of the source (an interrupted run)
is checked and continued; one that holds anything else is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ledger.app.commands.common import print_json
from ledger.errors import IntegrityError, LedgerError, UsageError
from ledger.events import GENESIS_HASH, Event, body_text, row_hash
from ledger.store import Reader, Recorder, open_store
from ledger.store.base import event_from_row


@dataclass(frozen=True, slots=True)
class ChainCheck:
    events: int
    head_hash: str


def redact(url: str) -> str:
    """The URL without its password, for messages and summaries."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        creds, host = parts.netloc.rsplit("@", 1)
        if ":" in creds:
            return urlunsplit(parts._replace(netloc=f"{creds.split(':', 1)[0]}:***@{host}"))
    return url


def verify_chain(store: Reader, on_row: Callable[[int], None] | None = None) -> ChainCheck:
    """Walk every stored row: seq 1..N without a gap, each prev_hash the hash before it,
    each hash recomputed from the stored columns, per-stream versions 1..n in order."""
    seq, prev = 0, GENESIS_HASH
    versions: dict[str, int] = {}
    for row in store.raw_rows(0):
        if row[0] != seq + 1:
            raise IntegrityError(seq + 1, f"next stored seq is {row[0]}")
        if row[9] != prev:
            raise IntegrityError(row[0], "prev_hash is not the hash of the event before")
        if row_hash(row[9], body_text(*row[:10])) != row[10]:
            raise IntegrityError(row[0], "hash does not match the event's content")
        if row[2] != versions.get(row[1], 0) + 1:
            raise IntegrityError(row[0], f"stream {row[1]!r} jumps to version {row[2]}")
        versions[row[1]] = row[2]
        seq, prev = row[0], row[10]
        if on_row is not None:
            on_row(seq)
    return ChainCheck(seq, prev)


def _hash_at(store: Reader, seq: int) -> str | None:
    rows = store.raw_rows(seq - 1, seq)
    try:
        row = next(rows, None)
    finally:
        rows.close()
    return row[10] if row else None


def migrate(source: Reader, dest: Recorder, *, batch: int = 5000,
            progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Copy `source` into `dest`; returns the summary. `progress(phase, done, total)` reports."""
    report = progress or (lambda phase, done, total: None)
    started = time.monotonic()
    total = source.head()
    src = verify_chain(source, lambda s: s % 5000 == 0 and report("verify source", s, total))
    report("verify source", src.events, total)
    present = dest.head()
    if present > src.events:
        raise LedgerError(
            f"destination holds {present} events, the source only {src.events}",
            hint="migrate into an empty ledger (or a copy of this one interrupted earlier)",
        )
    if present and _hash_at(dest, present) != _hash_at(source, present):
        raise LedgerError(
            f"destination's event {present} differs from the source's: it is another ledger",
            hint="migrate into an empty ledger",
        )
    copied = 0
    chunk: list[Event] = []
    for row in source.raw_rows(present):
        chunk.append(event_from_row(row))  # the stored texts, verbatim
        if len(chunk) >= batch:
            dest.import_events(chunk)
            copied += len(chunk)
            chunk = []
            report("copy", present + copied, src.events)
    if chunk:
        dest.import_events(chunk)
        copied += len(chunk)
    if copied:
        dest.refresh_statistics()  # the destination's verify below, and every read after, planned for its size
    report("copy", present + copied, src.events)
    dst = verify_chain(dest, lambda s: s % 5000 == 0 and report("verify destination", s, src.events))
    report("verify destination", dst.events, src.events)
    if dst != src:
        raise IntegrityError(dst.events, f"destination ends at {dst.events} ({dst.head_hash[:12]}), source at {src.events} ({src.head_hash[:12]})")
    return {
        "from": redact(source.url),
        "to": redact(dest.url),
        "events": src.events,
        "copied": copied,
        "already_present": present,
        "head_hash": src.head_hash,
        "source_verified": True,
        "destination_verified": True,
        "seconds": round(time.monotonic() - started, 3),
    }


@click.command("migrate")
@click.option("--from", "source_url", required=True, metavar="URL", help="Ledger to copy: sqlite:///path or postgresql://...")
@click.option("--to", "dest_url", required=True, metavar="URL", help="Ledger to copy into (created if missing; empty or an earlier partial copy).")
@click.option("--batch", default=5000, show_default=True, type=click.IntRange(1, 100_000), help="Events per destination transaction.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def migrate_command(source_url: str, dest_url: str, batch: int, as_json: bool) -> None:
    """Copy a ledger to another store, hash chain verified on both ends.

    \b
    Example: move the embedded ledger to a shared PostgreSQL server
      ledger migrate --from sqlite:///var/lib/tpu-ledger/ledger.db \\
                     --to postgresql://ledger@db.internal/ledger

    Then point every watcher and reconciler at it (LEDGER_STORE=postgresql://...).

    Events are copied as sealed envelopes (same seq, ids, times and hashes). An interrupted
    run is resumed by running the same command again. Snapshots are not copied (they are
    rebuilt on the next replay); cursors are not copied either.
    """
    if source_url == dest_url:
        raise UsageError("--from and --to name the same ledger", hint="give a different destination URL")

    source = open_store(source_url, create=False)
    try:
        dest = open_store(dest_url, create=True)
        try:
            err = Console(stderr=True)
            with Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=err, transient=True, disable=not err.is_terminal,  # no bar in logs and pipes
            ) as bar:
                tasks: dict[str, int] = {}

                def report(phase: str, done: int, total: int) -> None:
                    if phase not in tasks:
                        tasks[phase] = bar.add_task(phase, total=max(total, 1))
                    bar.update(tasks[phase], completed=done, total=max(total, 1))

                summary = migrate(source, dest, batch=batch, progress=report)
        finally:
            dest.close()
    finally:
        source.close()
    if as_json:
        print_json(summary)
    else:
        click.echo(
            f"migrated {summary['events']} events ({summary['copied']} copied, {summary['already_present']} already there) "
            f"from {summary['from']} to {summary['to']} in {summary['seconds']} s; "
            f"chain verified on both ends, head {summary['head_hash'][:16]}"
        )
