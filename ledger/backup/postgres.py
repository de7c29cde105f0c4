"""The shared ledger copied with PostgreSQL's own tools: `pg_dump` and `pg_restore`.

`pg_dump` reads every table of the ledger's schema in one repeatable-read snapshot (what
PostgreSQL documents as a consistent backup while the database is in use); the custom
format restores with `pg_restore`, which loads the rows before it creates the triggers, so
the append-only rules hold again once the restore commits. `--single-transaction` makes a
restore all or nothing. Both tools must be of the server's major version or newer
(Debian's postgresql-client).

The password never goes on a command line (where `ps` shows it): it is handed to the tools
in PGPASSWORD.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psycopg
from psycopg import conninfo, sql

from ledger.errors import LedgerError, StoreError, UsageError, safe_url
from ledger.store.postgres import split_url

TIMEOUT_S = 6 * 3600  # a dump that hangs this long is killed (a dead server, a full disk)


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise UsageError(f"{name} is not installed", hint="install PostgreSQL's client tools (Debian: postgresql-client)")
    return found


def _connection(url: str) -> tuple[str, dict[str, str], str]:
    """(libpq conninfo without the password, the environment that carries it, the schema)."""
    dsn, schema = split_url(url, None)
    params = conninfo.conninfo_to_dict(dsn)
    env = dict(os.environ)
    password = params.pop("password", None)
    if password is not None:
        env["PGPASSWORD"] = str(password)
    return conninfo.make_conninfo(**{k: str(v) for k, v in params.items()}), env, schema


def _run(argv: list[str], env: dict[str, str], what: str, url: str) -> None:
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise StoreError(f"{what} of {safe_url(url)} did not finish in {TIMEOUT_S} s") from exc
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        first = next((line for line in lines if "error" in line.lower()), lines[0] if lines else f"exit {done.returncode}")
        raise StoreError(f"{what} of {safe_url(url)} failed: {first.strip()}",
                         hint="a role the dump grants to must exist first (docs/backup.md)" if "role" in first else None)


def dump(url: str, dest: Path) -> str:
    """pg_dump the ledger's schema into `dest` (custom format); returns the schema's name."""
    info, env, schema = _connection(url)
    _run([_tool("pg_dump"), "--format=custom", "--no-owner", f"--schema={schema}", f"--file={dest}",
          f"--dbname={info}"], env, "pg_dump", url)
    return schema


def schema_of(url: str) -> str:
    return split_url(url, None)[1]


def restore(dump_file: Path, url: str) -> None:
    """pg_restore `dump_file` into the database of `url`, in one transaction."""
    info, env, _ = _connection(url)
    _run([_tool("pg_restore"), "--no-owner", "--single-transaction", "--exit-on-error", f"--dbname={info}",
          str(dump_file)], env, "pg_restore", url)


def drop_schema(url: str) -> None:
    """Drop the ledger schema of `url`: an empty one before a restore (the caller checked it
    holds no events), or one this restore loaded and found unsound."""
    dsn, schema = split_url(url, None)
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    except psycopg.Error as exc:
        raise LedgerError(f"cannot drop the ledger schema {schema!r} at {safe_url(url)}: "
                          f"{str(exc).strip().splitlines()[0]}", hint="drop it as its owner, then restore") from exc


def schema_exists(url: str) -> bool:
    dsn, schema = split_url(url, None)
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SELECT to_regnamespace(%s) IS NOT NULL", (f'"{schema}"',)).fetchone()
    except psycopg.OperationalError as exc:
        raise StoreError(f"cannot connect to {safe_url(url)}: {str(exc).strip().splitlines()[0]}") from exc
    return bool(row and row[0])
