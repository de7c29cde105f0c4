"""What an attacker with write access to the SQLite file can do, done for real on copies of a
ledger, and a bare jobs hub whose default branch trusts the reconciler's key."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from importlib import resources
from pathlib import Path

from ledger.checkpoints import NAMESPACE, AllowedSigners, SigningKey
from ledger.events import GENESIS_HASH, NewEvent, actor, body_text, row_hash
from ledger.store.sqlite import SQLiteStore

SIGNER = "recon-a"
OPS = actor("cli", "alice")


def append_notes(path: Path, n: int, text: str = "note") -> int:
    """n events on a system stream in one transaction; returns the head after them."""
    store = SQLiteStore(path)
    try:
        store.append("_ops", [NewEvent("note", {"text": f"{text} {i}"}, OPS) for i in range(n)])
        return store.head()
    finally:
        store.close()


def copy_ledger(path: Path, name: str) -> Path:
    """A copy of the whole ledger as a backup takes it (SQLite's online backup: the WAL too)."""
    target = path.with_name(name)
    source, copy = sqlite3.connect(path), sqlite3.connect(target)
    try:
        source.backup(copy)
    finally:
        source.close()
        copy.close()
    return target


def delete_tail(path: Path, keep: int) -> None:
    """Drop the trigger that refuses deletes and delete every event after `keep`."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.executescript(f"DROP TRIGGER events_no_delete; DELETE FROM events WHERE seq > {int(keep)};")
    finally:
        db.close()


def rewrite_and_rehash(path: Path, seq: int, data_json: str) -> None:
    """Edit one event, then recompute every hash from there on, so the chain verifies; the
    triggers are put back as they were, and no trace is left in the file."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("DROP TRIGGER events_no_update")
        db.execute("UPDATE events SET data = ? WHERE seq = ?", (data_json, seq))
        prev = GENESIS_HASH
        rows = db.execute("SELECT * FROM events ORDER BY seq").fetchall()
        db.execute("BEGIN")
        for row in rows:
            row = (*row[:9], prev)
            prev = row_hash(prev, body_text(*row))
            db.execute("UPDATE events SET prev_hash = ?, hash = ? WHERE seq = ?", (row[9], prev, row[0]))
        db.execute("COMMIT")
        db.executescript(resources.files("ledger.store.sqlite").joinpath("triggers.sql").read_text())
    finally:
        db.close()


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="Admin", GIT_AUTHOR_EMAIL="admin@lab.org", GIT_COMMITTER_NAME="Admin",
               GIT_COMMITTER_EMAIL="admin@lab.org", GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    proc = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, env=env, timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)}: {proc.stderr}")
    return proc.stdout


def make_hub(root: Path, key: Path, signer: str = SIGNER) -> Path:
    """A bare hub whose main branch holds .ledger/allowed_signers trusting `key` as `signer`."""
    hub, work = root / "hub.git", root / "admin"
    git(root, "init", "-q", "--bare", "-b", "main", str(hub))
    git(root, "clone", "-q", str(hub), str(work))
    line = AllowedSigners(()).line_for(signer, SigningKey.load(key).public_key, NAMESPACE)
    (work / ".ledger").mkdir()
    (work / ".ledger" / "allowed_signers").write_text(f"# who signs checkpoints\n{line}\n")
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", "Trust the reconciler's checkpoint key")
    git(work, "push", "-q", "origin", "HEAD:main")
    return hub


def wait_for(predicate, timeout: float = 60.0, step: float = 0.02):
    """Poll until `predicate()` is truthy; a hang becomes a failure, never a timing assertion."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)
    return value
