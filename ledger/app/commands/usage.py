"""`ledger usage`: who used how many chip-hours, how much of it was useful, what preemptions
cost, and what it would have cost on demand. docs/usage.md explains every column."""

from __future__ import annotations

import contextlib
import csv
import sys
from datetime import UTC, datetime

import click
from rich import box
from rich.table import Table

from ledger.app.commands.common import console, plain_table, print_json, store_from, write_columns
from ledger.app.figures import USAGE_HEADERS, chip_hours, duration, money, percent, usage_cells
from ledger.app.queueview import half_life_of
from ledger.app.readmodels import usage_json
from ledger.errors import LedgerError, UsageError
from ledger.events import format_time
from ledger.replay import fold_rows, resolve_until
from ledger.snapshots.plain import no_cyclic_gc
from ledger.spec.layout import POLICY_PATH
from ledger.store import Store, store_errors
from ledger.usage import (
    GROUPINGS,
    Prices,
    UsageFold,
    UsageReport,
    UsageRow,
    from_us,
    summarize,
    to_us,
)
from ledger.usage.share import ShareMeter
from ledger.usage.snapshot import Kept, latest, maybe_save_usage, usable

# Chip-hour figures in the order people read them: held, then what the holding went to, then waiting.
_HOURS = ("held", "running", "setup", "provisioning", "recovering", "after_end", "waiting")


def _moment(text: str, option: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"{option} {text!r} is not an ISO time", hint=f"e.g. {option} 2026-03-01T00:00:00Z") from None
    if moment.tzinfo is None:
        raise UsageError(f"{option} {text!r} has no time zone", hint=f"add Z for UTC, e.g. {option} 2026-03-01T00:00:00Z")
    return moment


def parse_prices(specs: tuple[str, ...]) -> dict[tuple[str, str], float]:
    """`--price v4/spot=1.2` options as a price table."""
    table: dict[tuple[str, str], float] = {}
    for spec in specs:
        key, _, usd = spec.partition("=")
        family, _, pricing = key.partition("/")
        try:
            value = float(usd)
        except ValueError:
            value = -1.0
        if not family or not pricing or not value >= 0:
            raise UsageError(f"--price {spec!r} is not FAMILY/PRICING=USD", hint="e.g. --price v4/spot=1.2, in USD per chip-hour")
        table[family, pricing] = value
    return table


def fold_usage(store: Store, since: str | None, until: str | None, *, per_attempt: bool = False,
               prices: Prices | None = None) -> tuple[UsageFold, int]:
    """The accounting fold over the ledger up to `until` (a seq or an ISO time, as
    `ledger replay --until`), and the moment the report stands at (us): `until`'s time, the
    time of event `until`, or now. The same ledger and options give the same report forever."""
    position = resolve_until(store, until)
    lo = to_us(_moment(since, "--since")) if since else None
    if until is None:
        hi, now = None, to_us(datetime.now(UTC))
    elif until.isdigit():
        position = min(int(until), store.head())
        last = next(iter(store.read_all(position - 1, limit=1)), None) if position else None
        hi = now = to_us(last.time) if last else to_us(datetime.now(UTC))
    else:
        hi = to_us(_moment(until, "--until"))
        now = min(hi, to_us(datetime.now(UTC)))
    if lo is not None and lo > now:
        raise UsageError(f"--since {since} is after the report's end ({format_time(from_us(now))})",
                         hint="--since must come before --until (and before now)")
    whole = lo is None and not per_attempt and not prices  # what a usage snapshot holds
    half_life = half_life_of(store)
    with no_cyclic_gc():  # a million rows make no cycles, but set off collections of every job
        kept = _snapshot(store, half_life, position, hi) if whole else None
        if kept is None:
            meter = ShareMeter(half_life)
            # The meter is fed only when the fold may be saved (a report at the head).
            saved = whole and until is None
            kept = meter, UsageFold(lo, hi, per_attempt=per_attempt, prices=prices, on_interval=meter.add if saved else None)
        meter, fold = kept
        fold.apply_rows(fold_rows(store, fold.position, position))
    if whole and until is None:
        # A report at the head keeps the next one fast; a read-only ledger still answers.
        with contextlib.suppress(LedgerError), store_errors(store.url):
            maybe_save_usage(store, meter, fold, now=now)
    return fold, now


def _snapshot(store: Store, half_life: float, position: int | None, hi: int | None) -> Kept | None:
    """The usage snapshot at or before `position` (the head when None), for a report that
    ends at `hi`: only one that counted nothing after `hi` (a report ending there would have
    cut it) gives the figures of a fold from the first event."""
    kept = usable(store, half_life, store.head() if position is None else position)
    if kept is None or hi is None:
        return kept
    if latest(kept[1]) > hi:
        return None
    kept[1].hi = hi
    return kept


# -- presentation -----------------------------------------------------------------------------
def missing_text(missing: tuple[str, ...]) -> str:
    return f"no price for {', '.join(missing)}"


def prices_text(fold: UsageFold) -> str:
    """Which prices the report ends with, and where they came from."""
    shown = [f"{p['family']}/{p['pricing']} ${p['usd_per_chip_hour']:g}" + (" (--price)" if p["from"] == "--price" else "")
             for p in fold.prices.in_force()]
    source = f"the policy of commit {fold.prices.commit[:10]}" if fold.prices.commit else "no policy_changed event yet"
    return f"prices per chip-hour in force at the end ({source}): {', '.join(shown) or 'none'}"


def accounting_line(row: UsageRow) -> str:
    """A job's usage in one line: `ledger inspect` ends with it."""
    parts = ", ".join(f"{c.replace('_', ' ')} {chip_hours(row.chip_hours(c))}" for c in _HOURS[1:-1] if row.chip_hours(c))
    preemptions = f"{row.preemptions} preemption{'s' if row.preemptions != 1 else ''}"
    if row.preemptions:
        preemptions += f" (lost {chip_hours(row.lost_chip_hours)} chip-h)"
    cost = (f"cost {money(row.cost)}, on demand {money(row.ondemand_cost)}" if not row.missing
            else f"cost: {missing_text(row.missing)}")
    return (f"usage: {chip_hours(row.chip_hours('held'))} chip-h held ({parts or 'nothing'}), "
            f"waiting {chip_hours(row.chip_hours('waiting'))}; goodput {percent(row.goodput)}; {preemptions}; "
            f"mean time to recover {duration(row.mttr_s)}; {cost}")


def usage_table(report: UsageReport, title: str) -> Table:
    """The table fits a 120-column terminal for ordinary figures: setup includes provisioning
    here (--json and --csv keep them apart). Figures are never cut; headers wrap at spaces."""
    body = [usage_cells(row) for row in report.rows]
    total = usage_cells(report.total)
    table = Table(title=title, title_justify="left", show_footer=bool(body), box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for i, name in enumerate((report.by, *USAGE_HEADERS)):
        widest = max(len(cells[i]) for cells in (*body, total))
        if i:
            table.add_column(name, footer=total[i], justify="right", overflow="fold",
                             min_width=max(widest, *(len(word) for word in name.split())))
        else:
            table.add_column(name, footer="total", overflow="fold", min_width=min(widest, 16))
    for cells in body:
        table.add_row(*cells)
    return table


def _csv(report: UsageReport) -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow([report.by, *(f"{c}_chip_hours" for c in _HOURS), "goodput", "preemptions", "lost_chip_hours",
                  "recoveries", "mttr_s", "cost_usd", "ondemand_usd", "missing_prices"])
    for row in report.rows:
        d = row.to_dict()
        out.writerow([row.group, *(d["chip_hours"][c] for c in _HOURS), d["goodput"], row.preemptions,
                      d["lost_chip_hours"], row.recoveries, d["mttr_s"], d["cost_usd"], d["ondemand_usd"],
                      " ".join(row.missing)])


@click.command("usage")
@click.option("--since", metavar="ISO-TIME", help="Count only what happened from this UTC time on (e.g. 2026-03-01T00:00:00Z).")
@click.option("--until", metavar="SEQ|ISO-TIME",
              help="The report as it stood at this seq or UTC time, from the ledger up to it (as `replay --until`): "
                   "last month's report reads the same forever.")
@click.option("--by", type=click.Choice(GROUPINGS), default="owner", show_default=True, help="One row per ...")
@click.option("--price", "prices", multiple=True, metavar="FAMILY/PRICING=USD",
              help="USD per chip-hour for an accelerator family and pricing model, e.g. --price v4/spot=1.2, over the "
                   "whole report instead of the policy's price in force; repeat for more.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (chip-hours, seconds, USD).")
@click.option("--csv", "as_csv", is_flag=True, help="Print the rows as CSV, for a spreadsheet.")
@click.pass_context
def usage_cmd(ctx: click.Context, since: str | None, until: str | None, by: str, prices: tuple[str, ...],
              as_json: bool, as_csv: bool) -> None:
    """Chip-hours per owner (or job, accelerator, zone, pricing, attempt): how many were held,
    how many ran, what setup, waiting and recovering took, goodput, preemptions and the work
    they lost, mean time to recover, and cost when a price is known.

    Prices come from `prices:` in .ledger/policy.yaml: the watcher records the table with
    every change of the file, and each interval is priced at the table in force when it
    happened (so --until reports keep their costs). A missing price is named, never guessed.

    Figures are chip-hours: time weighed by the TPU's chips (waiting: by the chips asked
    for). Held = running + setup (provisioning included) + recovering + after end;
    goodput = running / held. --json and --csv give provisioning apart. docs/usage.md
    explains every column.

    \b
    ledger usage                                        # everything so far, by owner
    ledger usage --since 2026-03-01T00:00:00Z --until 2026-04-01T00:00:00Z --by job
    ledger usage --by accelerator --price v4/spot=1.2 --price v4/ondemand=3.2
    ledger usage --json | jq '.total.goodput'
    """
    if as_json and as_csv:
        raise UsageError("--json and --csv are two ways to print the same report", hint="pick one")
    table = parse_prices(prices)
    store = store_from(ctx)
    with store_errors(store.url):
        fold, now = fold_usage(store, since, until, per_attempt=by == "attempt", prices=table)
    report = summarize(fold.figures(now), by)
    span = (format_time(from_us(fold.lo)) if since else None, format_time(from_us(now)))
    if as_json:
        print_json(usage_json(report, span[0], span[1], fold.position, fold.prices.in_force()))
        return
    if as_csv:
        _csv(report)
        return
    out = console()
    title = f"usage by {by} in chip-hours, {span[0] or 'from the start'} .. {span[1]} (up to seq {fold.position})"
    if plain_table(out, len(report.rows)):  # the total as the last row
        cells = [usage_cells(row) for row in report.rows]
        write_columns(sys.stdout, title, (by, *USAGE_HEADERS), [*cells, ["total", *usage_cells(report.total)[1:]]],
                      right=range(1, len(USAGE_HEADERS) + 1))
    else:
        out.print(usage_table(report, title))
    out.print(prices_text(fold))
    if report.missing:
        out.print(f"{missing_text(report.missing)}: their costs show '?'. Add them to `prices:` in "
                  f"{POLICY_PATH} (in force from the commit that brings them), or give --price FAMILY/PRICING=USD.")
