"""`ledger export` / `ledger import`: the ledger as JSON Lines of full envelopes.

Export writes each event's canonical encoding plus its hash, so a line hashes exactly as the
event did. Import goes into an empty store only, after checking the whole file (chain, hashes,
versions, schema) and naming the first bad line; nothing is written from a broken file.

Import carries each line's `actor` and `data` text verbatim into the store: the hash is
checked over the bytes it was made of, whichever canonical form wrote them (form 1 spelled a
float `1e-05` where today's encoder writes `0.00001`), and nothing is re-encoded.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import click
import msgspec

from ledger.app.commands.common import store_from
from ledger.errors import LedgerError, UsageError
from ledger.events import Event, export_lines
from ledger.verify import verify_rows

IMPORT_BATCH = 10_000


@click.command("export")
@click.argument("file", required=False, type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.pass_context
def export_cmd(ctx: click.Context, file: Path | None) -> None:
    """Write every event as JSON Lines to FILE (default: standard output).

    \b
    ledger export backup.jsonl
    ledger --store sqlite:///new.db import backup.jsonl
    """
    store = store_from(ctx)
    out = sys.stdout if file is None or str(file) == "-" else None
    try:
        handle = out or open(file, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise UsageError(f"cannot write {file}: {exc.strerror}") from exc
    try:
        handle.writelines(export_lines(store.raw_rows()))
    finally:
        if out is None:
            handle.close()


class _Line(msgspec.Struct):
    """One exported line: the envelope with `actor` and `data` kept as the text written."""

    seq: int
    stream: str
    version: int
    type: str
    time: str
    actor: msgspec.Raw
    id: str
    causation: str | None
    data: msgspec.Raw
    prev_hash: str
    hash: str


_decode_line = msgspec.json.Decoder(_Line).decode


def _event(line: str) -> Event:
    e = _decode_line(line)
    actor_text, data_text = bytes(e.actor).decode(), bytes(e.data).decode()
    actor, data = msgspec.json.decode(actor_text), msgspec.json.decode(data_text)
    if not isinstance(actor, dict) or not isinstance(data, dict):
        raise ValueError("actor and data must be JSON objects")
    return Event(e.seq, e.stream, e.version, e.type, e.time, actor, e.id, e.causation, data, e.prev_hash, e.hash,
                 actor_text, data_text)


def _parse(path: Path) -> Iterator[tuple[int, Event]]:
    """(line number, event) for each non-blank line; a malformed line is a LedgerError."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                event = _event(line)
            except ValueError as exc:  # msgspec.DecodeError is one
                raise LedgerError(f"{path}:{number}: not an event envelope ({exc})", hint="nothing was imported") from exc
            yield number, event


@click.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def import_cmd(ctx: click.Context, file: Path) -> None:
    """Load a JSON Lines export into an EMPTY store, after verifying the whole chain."""

    store = store_from(ctx, create=True)
    if store.head() != 0:
        raise UsageError(f"{store.url} is not empty (head {store.head()})", hint="import into a new store: --store sqlite:///new.db")
    lines: list[int] = []

    def rows() -> Iterator[tuple]:
        for number, event in _parse(file):
            lines.append(number)
            yield event.row()

    # Transitions are history, not integrity: an anomalous history is imported faithfully.
    report = verify_rows(rows(), transitions=False)
    if report.problem is not None:
        line = lines[report.events - 1] if report.events else 0
        raise LedgerError(f"{file}:{line}: {report.problem.reason}", hint="nothing was imported")
    batch: list[Event] = []
    for _, event in _parse(file):
        batch.append(event)
        if len(batch) >= IMPORT_BATCH:
            store.import_events(batch)
            batch = []
    if batch:
        store.import_events(batch)
    if report.events:
        store.refresh_statistics()  # as `ledger migrate` does: the reads after it planned for its size
    click.echo(f"imported {report.events} event(s) into {store.url}", err=True)
