"""Heartbeats on both stores: a row per instance beside the ledger (never an event), judged by
the store's clock, created where missing so older code and the store format are unaffected."""

from __future__ import annotations

import json
import secrets
import time
import urllib.parse
from collections.abc import Callable

import psycopg
import pytest
from click.testing import CliRunner

from ledger import defaults
from ledger.app.cli import cli
from ledger.app.observability.heartbeat import HeartbeatThread
from ledger.app.observability.service import Service
from ledger.store import open_heartbeats, open_store
from ledger.store.heartbeats import ALIVE, DEAD, STOPPED, Beat
from ledger.store.postgres import READER_ROLE, WRITER_ROLE


def _beat(instance: str, lease: bool | None = None) -> Beat:
    return Beat(instance, "reconcile", "host-a", 4242, "0.1.0", time.time() - 10, lease)


def test_beats_are_rows_not_events(new_ledger_url: Callable[[], str]) -> None:
    url = new_ledger_url()
    with open_store(url) as store:
        head = store.head()
    beats = open_heartbeats(url)
    try:
        beats.beat(_beat("reconcile@host-a:4242", True))
        beats.beat(_beat("reconcile@host-a:4242", False))  # the same instance: one row, updated
        beats.beat(_beat("watch@host-b:7"))
        rows = {b.instance: b for b in beats.all()}
        assert set(rows) == {"reconcile@host-a:4242", "watch@host-b:7"}
        row = rows["reconcile@host-a:4242"]
        assert (row.component, row.host, row.pid, row.version, row.lease_held) == ("reconcile", "host-a", 4242, "0.1.0", False)
        assert row.state(defaults.HEARTBEAT_DEAD_S) == ALIVE
        assert row.state(-1.0) == DEAD  # older than the threshold: dead
        assert rows["watch@host-b:7"].lease_held is None
        beats.stop("watch@host-b:7")
        assert {b.instance: b for b in beats.all()}["watch@host-b:7"].state(defaults.HEARTBEAT_DEAD_S) == STOPPED
        assert beats.forget(3600.0) == 0
    finally:
        beats.close()
    with open_store(url, create=False) as store:
        assert store.head() == head  # heartbeats never enter the ledger


def test_a_reader_of_a_ledger_without_heartbeats_sees_none(new_ledger_url: Callable[[], str]) -> None:
    url = new_ledger_url()
    open_store(url).close()
    beats = open_heartbeats(url, create=False)
    try:
        assert beats.all() == []
    finally:
        beats.close()


def test_the_thread_beats_and_says_it_stopped(new_ledger_url: Callable[[], str]) -> None:
    url = new_ledger_url()
    open_store(url).close()
    thread = HeartbeatThread(url, "fanout", every=0.05).start()
    deadline = time.monotonic() + 30
    while thread.beats < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert thread.beats >= 3
    thread.close()
    beats = open_heartbeats(url, create=False)
    try:
        (row,) = beats.all()
    finally:
        beats.close()
    assert row.instance == thread.instance and row.component == "fanout"
    assert row.state(defaults.HEARTBEAT_DEAD_S) == STOPPED


def test_forget_drops_only_silent_instances(new_ledger_url: Callable[[], str]) -> None:
    url = new_ledger_url()
    beats = open_heartbeats(url)
    try:
        beats.beat(_beat("old@h:1"))
        time.sleep(0.2)
        beats.beat(_beat("new@h:2"))
        assert beats.forget(0.1) == 1
        assert [b.instance for b in beats.all()] == ["new@h:2"]
    finally:
        beats.close()


def test_status_lists_instances(new_ledger_url: Callable[[], str]) -> None:
    url = new_ledger_url()
    beats = open_heartbeats(url)
    try:
        beats.beat(_beat("reconcile@host-a:1", True))
        beats.beat(Beat("watch@host-b:2", "watch", "host-b", 2, "0.1.0", time.time()))
    finally:
        beats.close()
    result = CliRunner().invoke(cli, ["--store", url, "status", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["instance"]: r for r in json.loads(result.output)}
    assert rows["reconcile@host-a:1"]["state"] == "alive" and rows["reconcile@host-a:1"]["lease_held"] is True
    text = CliRunner().invoke(cli, ["--store", url, "status"])
    assert "reconcile@host-a:1" in text.output and "watch@host-b:2" in text.output and "alive" in text.output


def test_readiness_fails_when_the_shared_store_is_gone(pg_url: str, pg_database: str) -> None:
    """A service on PostgreSQL: ready while its schema answers; once the ledger's schema is
    dropped, /readyz's `store` check fails and says what it could not read."""
    open_store(pg_url).close()
    service = Service("fanout", pg_url, None, heartbeat=False).start()
    try:
        ready, body = service.readiness.run()
        assert ready, body
        schema = pg_url.rsplit("schema=", 1)[1]
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        ready, body = service.readiness.run()
        assert not ready and "store" in body["failed"], body
        assert "no ledger in schema" in body["checks"]["store"]["detail"]
    finally:
        service.close()


def test_the_writer_role_beats_and_the_reader_role_reads(pg_url: str, pg_admin_url: str) -> None:
    """The table is created after roles.sql ran: its creator grants it as roles.sql grants the
    ledger's tables, so a service logged in as a ledger_writer member beats, a ledger_reader
    member (`ledger status`, the dashboard) reads and cannot beat."""
    open_heartbeats(pg_url).close()  # the owner creates the ledger and the table
    logins = {role: f"hb_{secrets.token_hex(4)}" for role in (WRITER_ROLE, READER_ROLE)}
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for role, login in logins.items():
            conn.execute(f'CREATE ROLE "{login}" LOGIN IN ROLE {role}')
    parts = urllib.parse.urlsplit(pg_url)

    def as_login(role: str) -> str:
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{logins[role]}@{parts.netloc.rsplit('@', 1)[-1]}"))

    try:
        writer = open_heartbeats(as_login(WRITER_ROLE), create=False)
        try:
            writer.beat(_beat("reconcile@host-w:1", True))
        finally:
            writer.close()
        reader = open_heartbeats(as_login(READER_ROLE), create=False)
        try:
            assert [b.instance for b in reader.all()] == ["reconcile@host-w:1"]
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                reader.beat(_beat("mallory@h:2"))
        finally:
            reader.close()
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            for login in logins.values():
                conn.execute(f'DROP OWNED BY "{login}"')
                conn.execute(f'DROP ROLE "{login}"')
