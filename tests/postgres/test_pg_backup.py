"""`ledger backup` / `ledger restore` against the real PostgreSQL server: pg_dump while a
writer appends, pg_restore into another database, the database's rules in force again."""

from __future__ import annotations

import contextlib
import json
import secrets
from pathlib import Path

import psycopg
import pytest

from ledger.store import open_store
from ledger.store.postgres import split_url
from ledger.verify import verify_store
from tests.backup.helpers import SIGNER, grow, ledger, reconciler_key, writer


@pytest.fixture
def other_database(pg_admin_url: str):
    name = f"ledger_restore_{secrets.token_hex(5)}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{pg_admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_pg_dump_while_appending_restores_into_another_database_with_its_rules(pg_url: str, other_database: str,
                                                                              tmp_path: Path):
    grow(pg_url, 300)
    key, allowed = reconciler_key(tmp_path)
    with writer(pg_url):
        taken = ledger(pg_url, "backup", str(tmp_path / "b"), "--ssh-key", str(key), "--signer", SIGNER, "--json")
    assert taken.exit_code == 0, taken.output
    manifest = json.loads(taken.output)["manifest"]
    assert manifest["backend"] == "postgresql" and manifest["head"] > 300
    schema = split_url(pg_url, None)[1]
    assert manifest["schema"] == schema

    target = f"{other_database}?schema={schema}"
    done = ledger(target, "restore", str(tmp_path / "b"), "--allowed-signers", str(allowed), "--json")
    assert done.exit_code == 0, done.output
    restored_head = json.loads(done.output)["head"]
    assert restored_head >= manifest["head"]  # the dump ran after the signed head was read
    with contextlib.closing(open_store(target, create=False)) as restored:
        assert verify_store(restored).ok and restored.hash_at(manifest["head"]) == manifest["head_hash"]
    with psycopg.connect(split_url(target, None)[0], autocommit=True) as conn, \
            pytest.raises(psycopg.Error, match="append-only"):
        conn.execute(f'DELETE FROM "{schema}".events WHERE seq = 1')  # the triggers came back
    assert grow(target, 1) == restored_head + 1

    again = ledger(target, "restore", str(tmp_path / "b"), "--allowed-signers", str(allowed))
    assert again.exit_code == 2 and "is not empty" in again.output
    elsewhere = ledger(f"{other_database}?schema=t_other", "restore", str(tmp_path / "b"), "--allowed-signers", str(allowed))
    assert elsewhere.exit_code == 2 and f"?schema={schema}" in elsewhere.output
