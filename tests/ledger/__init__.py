"""Tests of the ledger core: events, stores (per backend), replay, verify, CLI."""
