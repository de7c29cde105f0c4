"""Helpers shared by command modules: opening the store, printing JSON and tables."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ledger.store import Store, open_store


def store_from(ctx: click.Context, *, create: bool = False) -> Store:
    """The store named by --store / LEDGER_STORE (read commands do not create one)."""
    root = ctx.find_root()
    url = (root.obj or {}).get("store_url")
    return open_store(url, create=create)


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    sys.stdout.write("\n")


def console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)
