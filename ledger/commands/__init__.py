"""CLI command modules; each exposes `register(group)` (see ledger/cli.py)."""
