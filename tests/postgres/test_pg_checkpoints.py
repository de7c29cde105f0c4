"""Checkpoints on a PostgreSQL ledger: signed from its head, and a tail deleted by a superuser
(triggers disabled) is reported by `ledger verify --checkpoints`, naming the checkpoint."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import psycopg
from click.testing import CliRunner

from ledger.app.cli import cli
from ledger.events import NewEvent, actor
from ledger.store import open_store
from reconciler.keys import ensure_key


def run(url: str, *args: str, key: Path):
    env = {"LEDGER_SSH_KEY": str(key), "LEDGER_RECONCILER_ID": "recon-pg"}
    return CliRunner(env=env).invoke(cli, ["--store", url, *args])


def test_a_deleted_tail_of_a_postgres_ledger_contradicts_its_checkpoint(pg_url: str, tmp_path: Path):
    key = tmp_path / "id_ecdsa"
    ensure_key(key)
    store = open_store(pg_url, create=True)
    store.append("_ops", [NewEvent("note", {"text": f"n{i}"}, actor("cli", "alice")) for i in range(5)])
    store.close()
    out, allowed = tmp_path / "checkpoint", tmp_path / "allowed_signers"
    assert run(pg_url, "checkpoint", "--out", str(out), key=key).exit_code == 0
    allowed.write_text(run(pg_url, "checkpoint", "--allowed-signer", key=key).stdout)
    check = ("verify", "--from", str(out), "--allowed-signers", str(allowed))
    assert run(pg_url, *check, key=key).exit_code == 0

    parts = urlsplit(pg_url)
    schema = parse_qs(parts.query)["schema"][0]
    dsn = parts._replace(query=f"options={quote(f'-c search_path={schema}')}").geturl()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE events DISABLE TRIGGER ALL")
        conn.execute("DELETE FROM events WHERE seq > 3")
        conn.execute("ALTER TABLE events ENABLE TRIGGER ALL")
    assert run(pg_url, "verify", key=key).exit_code == 0  # the chain alone cannot see it
    result = run(pg_url, *check, key=key)
    assert result.exit_code == 1
    assert "at seq 5 signed by recon-pg" in result.stderr
    assert "truncated: the ledger ends at seq 3, the checkpoint saw seq 5" in result.stderr
