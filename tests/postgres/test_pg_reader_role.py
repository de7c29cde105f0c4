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

from ledger.errors import StoreError
from ledger.events import NewEvent, actor
from ledger.store import open_store
from ledger.store.postgres import READER_ROLE, split_url
from ledger.verify import verify_store
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
