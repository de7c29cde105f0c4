"""Helpers shared by command modules: opening the store, printing JSON and tables."""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ledger import defaults, jsontext
from ledger.app.optiontypes import FC
from ledger.store import Store, open_store

if TYPE_CHECKING:
    from rich.console import Console


def store_from(ctx: click.Context, *, create: bool = False) -> Store:
    """The store named by --store / LEDGER_STORE (read commands do not create one)."""
    root = ctx.find_root()
    url = (root.obj or {}).get("store_url")
    return open_store(url, create=create)


def print_json(value: Any, *, plain: bool = False) -> None:
    """`value` as indented JSON, keys sorted. `plain`: the value holds JSON's own types only
    (read models of the events: str, int, float, bool, None, lists, dicts with str keys), so
    msgspec writes it, the same bytes as json.dump, ten times faster (10,000 jobs' states:
    18 MB in 0.2 s instead of 2.2 s). Anything else (a datetime, a set) goes through json's
    `default=str`, which msgspec would write differently."""
    if plain:  # bytes as they are: a 277 MB answer is not copied into a str twice more
        sys.stdout.flush()
        out = sys.stdout.buffer
        out.write(jsontext.pretty(value))
        out.write(b"\n")
        out.flush()
        return
    json.dump(value, sys.stdout, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    sys.stdout.write("\n")


def print_json_items(items: Iterable[bytes | memoryview]) -> None:
    """A list whose items are already JSON text (`jsontext.item`), as print_json(plain=True)
    prints the list of their values, written as it comes."""
    sys.stdout.flush()
    out = sys.stdout.buffer
    jsontext.write_list(out, items)
    out.write(b"\n")
    out.flush()


def console() -> Console:
    from rich.console import Console  # start-up time: `ledger reconcile` never loads rich

    return Console(highlight=False, soft_wrap=True)


class ProgressBar:
    """A progress bar on standard error for long work, drawn from its first report on: work
    that ends before reporting (a read from a recent snapshot) shows none, and neither does
    standard error that is not a terminal (a log, a pipe). Call it with how far the work got
    (and a new description when the stage changes); it is erased at the end."""

    def __init__(self, description: str, total: int) -> None:
        self.description, self.total = description, total
        self._bar: Any = None
        self._task: Any = None
        self._off = False

    def __call__(self, completed: int, description: str | None = None) -> None:
        if self._off:
            return
        if self._bar is None:
            from rich.console import Console  # start-up time, as `console`
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            screen = Console(file=sys.stderr)
            if not screen.is_terminal:
                self._off = True
                return
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                 console=screen, transient=True)
            self._task = self._bar.add_task(description or self.description, total=self.total, completed=completed)
            self._bar.start()
        self._bar.update(self._task, completed=completed, description=description or self.description)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


# Above this many rows a table is written as plain columns: rich measures and renders every
# cell (about 0.6 ms a row of seven cells: `ledger list` of 118,956 jobs took 75 s and 2 GB).
RICH_TABLE_ROWS = 500
# A cell's control characters (a newline in a cloud error, an escape in a spec field) would
# break its row or drive the reader's terminal: each becomes a space.
_CONTROL = {c: " " for c in (*range(0x20), 0x7F)}


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                no_wrap: Collection[str] = ()) -> None:
    """A titled table: rich's, boxed and wrapped to the terminal, when a person reads a
    terminal and the rows are few; otherwise plain columns, one line a row, never folded,
    which `grep`, `sort` and `less -S` take as they are (rich folds long cells to a pipe's
    80 columns, across lines). A cell is a str, or a rich Text to colour it on a terminal
    (its plain text in columns)."""
    out = console()
    if not plain_table(out, len(rows)):
        from rich.table import Table
        from rich.text import Text

        # Cells as Text: a "[" in a cloud error or a job's words is text, never rich markup
        # (a stray "[/]" made rich raise; "[bold]" would have vanished).
        table = Table(title=None if title is None else Text(title), title_justify="left")
        for name in columns:
            table.add_column(Text(name), no_wrap=name in no_wrap, overflow="fold")
        for row in rows:
            table.add_row(*(cell if isinstance(cell, Text) else Text(cell) for cell in row))
        out.print(table)
        return
    write_columns(sys.stdout, title, columns, rows)


def plain_table(out: Any, rows: int) -> bool:
    """Whether a table of `rows` rows goes to `out` (a rich Console) as plain columns."""
    return not out.is_terminal or rows > RICH_TABLE_ROWS


def write_columns(out: Any, title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                  right: Collection[int] = ()) -> None:
    """`title` (if any), then `columns` and `rows` as text columns two spaces apart, each as wide as
    its widest cell in terminal cells (the last one unpadded unless it is `right`-aligned:
    the columns at those indexes, figures, are aligned on their right edge). Every row has a
    cell for every column."""
    table = [columns, *rows]
    if any(len(row) != len(columns) for row in table):
        raise ValueError(f"a row has not the {len(columns)} cells of columns {tuple(columns)}")
    cells = [_column(column, i in right, i < len(columns) - 1 or i in right) for i, column in enumerate(zip(*table, strict=True))]
    # Padded column by column, then one format a row: the work per cell is done in C (118,956
    # rows of `ledger list`: 0.89-1.03 -> 0.39-0.54 s CPU, docs/benchmarks.md stop 50)
    line = "  ".join(["{}"] * len(columns))
    lines = [] if title is None else [title.translate(_CONTROL)]
    lines += [line.format(*row).rstrip(" ") for row in zip(*cells, strict=True)]
    out.write("\n".join(lines) + "\n")


def _column(column: Sequence[Any], right: bool, padded: bool) -> list[str]:
    """A column's cells as text without control characters, padded (when `padded`) to the
    widest one in terminal cells: a column of printable ASCII (nearly every one) is measured
    by its lengths and padded by str.ljust / rjust."""
    from rich.cells import cell_len  # a CJK character is two cells wide, as a terminal draws it

    text = [*map(str, column)]
    joined = "".join(text)
    if joined.isascii() and joined.isprintable():
        if not padded:
            return text
        width = max(map(len, text))
        return [*map((str.rjust if right else str.ljust), text, [width] * len(text))]
    text = [c if c.isprintable() else c.translate(_CONTROL) for c in text]
    if not padded:
        return text
    sizes = [len(c) if c.isascii() else cell_len(c) for c in text]
    width = max(sizes)
    return [" " * (width - n) + c if right else c + " " * (width - n) for c, n in zip(text, sizes, strict=True)]


def tpu_access_options(func: FC) -> FC:
    """`--project`, `--tpu-endpoint`, `--ssh-key`, `--ssh-user`: how to reach the TPUs and their hosts."""
    for option in reversed((
        click.option("--project", envvar="LEDGER_PROJECT", default=None,
                     help="Google Cloud project of the TPUs; required without --tpu-endpoint [env: LEDGER_PROJECT; "
                          f"default with --tpu-endpoint: {defaults.PROJECT}]."),
        click.option("--tpu-endpoint", envvar="LEDGER_TPU_ENDPOINT", default=None,
                     help="host:port of a TPU API without TLS (the emulator); unset = Google Cloud [env: LEDGER_TPU_ENDPOINT]."),
        click.option("--ssh-key", envvar="LEDGER_SSH_KEY", type=click.Path(path_type=Path), default=None,
                     help="Private key for TPU hosts; created if missing [env: LEDGER_SSH_KEY]."),
        click.option("--ssh-user", envvar="LEDGER_SSH_USER", default=defaults.SSH_USER, show_default=True),
    )):
        func = option(func)
    return func


def log_archive_option(func: FC) -> FC:
    return click.option(
        "--log-archive", envvar="LEDGER_LOG_ARCHIVE", default=None, metavar="DIR|gs://BUCKET/PREFIX",
        help="Where every reconciler collects job logs: a directory they share, or Cloud Storage "
             "[env: LEDGER_LOG_ARCHIVE; default: $XDG_DATA_HOME/tpu-ledger/job-logs].",
    )(func)


def topic_option(func: FC) -> FC:
    """`--topic`: fan every appended event out over Pub/Sub while this command runs."""
    return click.option(
        "--topic", envvar="LEDGER_PUBSUB_TOPIC", default=None, metavar="TOPIC",
        help="Also publish every event to this Pub/Sub topic while running (needs --project / "
             "LEDGER_PROJECT; PUBSUB_EMULATOR_HOST for the emulator) [env: LEDGER_PUBSUB_TOPIC].",
    )(func)
