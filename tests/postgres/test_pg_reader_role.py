"""The read-only role `ledger_reader` on the real server: a login in it reads, verifies and
serves the dashboard, and every write is refused by privileges."""

from __future__ import annotations

import contextlib
import http.client
import json
import secrets
import urllib.parse

import psycopg
import pytest
from click.testing import CliRunner

from ledger.app.cli import cli
from ledger.errors import StoreError
from ledger.events import NewEvent, actor
from ledger.replay import SNAPSHOT_EVERY
from ledger.store import open_store
from ledger.store.postgres import READER_ROLE, split_url
from ledger.verify import verify_store
from tests.admission.lab import POLICY
from tests.dashboard.conftest import serve


@pytest.fixture
def reader_url(pg_url: str, pg_admin_url: str):
    """The ledger at `pg_url` as seen by a login role that is a member of ledger_reader only."""
    with contextlib.closing(open_store(pg_url)) as store:
        store.append("alice/bert", [NewEvent("submitted", {"spec": {"tpu": {"accelerator": "v4-8"}}, "spec_hash": "ab12ab12",
                                                           "commit": "c0ffee00", "path": "jobs/alice/bert.yaml"},
                                             actor("git", "alice"))])
    login = f"dash_{secrets.token_hex(4)}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{login}" LOGIN IN ROLE {READER_ROLE}')
    parts = urllib.parse.urlsplit(pg_url)
    yield urllib.parse.urlunsplit(parts._replace(netloc=f"{login}@{parts.netloc.rsplit('@', 1)[-1]}"))
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP OWNED BY "{login}"')
        conn.execute(f'DROP ROLE "{login}"')


def test_the_reader_role_reads_and_verifies_but_cannot_write(reader_url: str):
    with contextlib.closing(open_store(reader_url, create=False)) as store:
        assert store.head() == 1 and verify_store(store).ok
        assert [e.type for e in store.read_stream("alice/bert")] == ["submitted"]
        with pytest.raises((StoreError, psycopg.errors.InsufficientPrivilege)):
            store.append("alice/bert", [NewEvent("cancel_requested", {}, actor("cli", "mallory"))])
    dsn, schema = split_url(reader_url, None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in (f'INSERT INTO "{schema}".cursors VALUES (\'x\', 1)', f'DELETE FROM "{schema}".snapshots',
                          f'UPDATE "{schema}".leases SET holder = \'me\''):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


def test_the_dashboard_runs_on_the_reader_role(reader_url: str):
    with serve(reader_url) as site:
        parts = urllib.parse.urlsplit(site.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
        conn.request("GET", "/api/jobs")
        assert [j["id"] for j in json.loads(conn.getresponse().read())["jobs"]] == ["alice/bert"]
        conn.request("GET", "/jobs/alice/bert")
        response = conn.getresponse()
        assert response.status == 200 and "alice/bert" in response.read().decode()
        conn.close()


def test_a_queue_on_the_reader_role_answers_without_saving_usage(reader_url: str, pg_url: str, tmp_path):
    """`ledger queue` folds usage and the capacity memory from the first event when no
    snapshot of them is usable and saves them for the next reader: on the read-only role the
    saves are refused, and the queue still answers (no traceback, nothing saved)."""
    with contextlib.closing(open_store(pg_url)) as store:
        store.append("alice/notes", [NewEvent("note", {"text": str(i)}) for i in range(SNAPSHOT_EVERY)])
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    result = CliRunner().invoke(cli, ["--store", reader_url, "queue", "--policy", str(policy), "--json"])
    assert result.exit_code == 0, result.output
    assert [row["job"] for row in json.loads(result.output)] == ["alice/bert"]
    with contextlib.closing(open_store(pg_url)) as store:
        assert not [s for s in store.list_snapshots() if s.name.startswith("usage/") or s.name == "capacity"]
