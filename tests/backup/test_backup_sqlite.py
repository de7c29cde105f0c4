"""`ledger backup` and `ledger restore` on SQLite: taken while a writer appends, restored only
into an empty ledger, and refused when the copy, its chain or its checkpoint do not prove it."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

from ledger.store import open_store
from ledger.verify import verify_store
from tests.backup.helpers import SIGNER, grow, ledger, reconciler_key, writer


def test_a_backup_taken_while_the_ledger_grows_restores_to_the_head_its_checkpoint_signed(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    grow(url, 500)
    key, allowed = reconciler_key(tmp_path)
    with writer(url) as heads:
        taken = ledger(url, "backup", str(tmp_path / "b1"), "--ssh-key", str(key), "--signer", SIGNER, "--json")
        during = heads[-1]
    assert taken.exit_code == 0, taken.output
    manifest = json.loads(taken.output)["manifest"]
    assert manifest["head"] > 500 and manifest["backend"] == "sqlite"
    assert sorted(p.name for p in (tmp_path / "b1").iterdir()) == ["checkpoint", "checkpoint.sig", "ledger.db", "manifest.json"]
    assert "BEGIN SSH SIGNATURE" in (tmp_path / "b1" / "checkpoint.sig").read_text()
    assert during > 0 and grow(url, 1) > manifest["head"]  # the source went on growing

    target = f"sqlite:///{tmp_path / 'restored' / 'ledger.db'}"
    done = ledger(target, "restore", str(tmp_path / "b1"), "--allowed-signers", str(allowed), "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["head"] == manifest["head"] and report["checkpoint"]["signer"] == SIGNER
    with contextlib.closing(open_store(target, create=False)) as restored:
        assert verify_store(restored).ok and restored.hash_at(manifest["head"]) == manifest["head_hash"]
    assert grow(target, 1) == manifest["head"] + 1  # a ledger the services can open and extend
    assert not list((tmp_path / "restored").glob(".*restore*"))  # no staging file left


def test_restore_refuses_a_ledger_with_events_and_loads_into_an_empty_one(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    grow(url, 20)
    key, allowed = reconciler_key(tmp_path)
    assert ledger(url, "backup", str(tmp_path / "b"), "--ssh-key", str(key), "--signer", SIGNER).exit_code == 0
    refused = ledger(url, "restore", str(tmp_path / "b"), "--allowed-signers", str(allowed))
    assert refused.exit_code == 2 and "is not empty: it holds 20 event(s)" in refused.output

    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    open_store(empty).close()  # a service started first and created an empty ledger
    assert ledger(empty, "restore", str(tmp_path / "b"), "--allowed-signers", str(allowed)).exit_code == 0
    with contextlib.closing(open_store(empty, create=False)) as restored:
        assert restored.head() == 20

    again = ledger(url, "backup", str(tmp_path / "b"), "--ssh-key", str(key))
    assert again.exit_code == 2 and "not an empty folder" in again.output


def _backup(tmp_path: Path, name: str, notes: int, text: str = "note") -> tuple[Path, Path]:
    url = f"sqlite:///{tmp_path / f'{name}.db'}"
    grow(url, notes, stream=f"_{text}")
    key, allowed = reconciler_key(tmp_path)
    assert ledger(url, "backup", str(tmp_path / name), "--ssh-key", str(key), "--signer", SIGNER).exit_code == 0
    return tmp_path / name, allowed


def _restore(tmp_path: Path, folder: Path, allowed: Path):
    target = tmp_path / "target.db"
    out = ledger(f"sqlite:///{target}", "restore", str(folder), "--allowed-signers", str(allowed))
    return out, target


def test_a_damaged_copy_is_refused_before_anything_is_loaded(tmp_path: Path):
    folder, allowed = _backup(tmp_path, "b", 30)
    copy = folder / "ledger.db"
    data = bytearray(copy.read_bytes())
    data[-100] ^= 0xFF
    copy.write_bytes(bytes(data))
    out, target = _restore(tmp_path, folder, allowed)
    assert out.exit_code == 1 and "ledger.db is damaged" in out.output and not target.exists()


def test_another_ledger_passed_off_as_the_backup_contradicts_its_signed_checkpoint(tmp_path: Path):
    """Whoever can write the backup folder swaps the copy for another chain of the same
    length and fixes the manifest's digest: the signed checkpoint gives it away."""
    folder, allowed = _backup(tmp_path, "b", 30)
    other, _ = _backup(tmp_path, "other", 30, text="forged")
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "ledger.db").write_bytes((other / "ledger.db").read_bytes())
    manifest.update(json.loads((other / "manifest.json").read_text()) | {"head_hash": manifest["head_hash"]})
    (folder / "manifest.json").write_text(json.dumps(manifest))
    out, target = _restore(tmp_path, folder, allowed)
    assert out.exit_code == 1 and "rewritten" in out.output and not target.exists(), out.output


def test_a_checkpoint_signed_by_a_key_nobody_trusts_is_refused(tmp_path: Path):
    folder, _ = _backup(tmp_path, "b", 10)
    _, stranger = reconciler_key(tmp_path / "elsewhere")
    out, target = _restore(tmp_path, folder, stranger)
    assert out.exit_code == 1 and "untrusted" in out.output and not target.exists(), out.output


def test_the_copy_is_one_self_contained_file(tmp_path: Path):
    folder, _ = _backup(tmp_path, "b", 5)
    with contextlib.closing(sqlite3.connect(folder / "ledger.db")) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint", "checkpoint.sig", "ledger.db", "manifest.json"]
