"""`ledger checkpoint` and `ledger verify --checkpoints` on real SQLite files and a real git hub.

Each attack is done for real on a copy of the ledger: the tail deleted after dropping the
trigger that refuses it, an older copy of the file put back (and appended to), and an event
edited with every hash after it recomputed. Plain `ledger verify` calls each of those sound;
with the published checkpoints, each is reported, naming the checkpoint it contradicts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ledger.app.cli import cli
from ledger.app.commands.checkpoint import start_checkpoints
from ledger.checkpoints import Checkpoint, Checkpointer, CheckpointRepo, GitSink, SigningKey, sign
from ledger.store.sqlite import SQLiteStore
from tests.checkpoints.helpers import (
    SIGNER,
    append_notes,
    copy_ledger,
    delete_tail,
    git,
    rewrite_and_rehash,
    wait_for,
)

REF = "refs/ledger/checkpoints"
REPO = Path(__file__).resolve().parents[2]


def ledger(path: Path, *args: str, key: Path | None = None, hub: Path | None = None):
    env = {"COLUMNS": "400", "LEDGER_RECONCILER_ID": SIGNER}
    if key is not None:
        env["LEDGER_SSH_KEY"] = str(key)
    if hub is not None:
        env["LEDGER_CHECKPOINT_REPO"] = str(hub)
    return CliRunner(env=env).invoke(cli, ["--store", f"sqlite:///{path}", *args])


def checkpoint(path: Path, key: Path, hub: Path) -> Checkpoint:
    result = ledger(path, "checkpoint", "--json", key=key, hub=hub)
    assert result.exit_code == 0, result.output
    return Checkpoint(**{k: v for k, v in json.loads(result.stdout).items() if k in Checkpoint.__slots__})


def verify(path: Path, hub: Path, *args: str):
    return ledger(path, "verify", "--checkpoints", *args, hub=hub)


def assert_names(result, cp: Checkpoint, kind_words: str) -> None:
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"error: the ledger contradicts checkpoint of {cp.time} at seq {cp.seq} signed by {SIGNER} "
                           f"({REF}@"), line
    assert kind_words in line, line


def test_a_sound_ledger_agrees_with_its_checkpoints(ledger_file, signing_key, checkpoint_hub):
    first = checkpoint(ledger_file, signing_key, checkpoint_hub)
    append_notes(ledger_file, 3, "later")
    second = checkpoint(ledger_file, signing_key, checkpoint_hub)
    assert (first.seq, second.seq) == (6, 9)
    # The ref is a commit chain: one commit per checkpoint, each the child of the one before.
    log = git(checkpoint_hub, "log", "--format=%s", REF).splitlines()
    assert log == [f"checkpoint: seq 9 by {SIGNER}", f"checkpoint: seq 6 by {SIGNER}"]
    assert git(checkpoint_hub, "show", f"{REF}:checkpoint").startswith("tpu-ledger checkpoint v1\nseq 9\n")

    result = verify(ledger_file, checkpoint_hub)
    assert result.exit_code == 0, result.output
    assert f"checkpoints: 2 agree with the ledger; the newest is the checkpoint of {second.time} at seq 9" in result.stdout

    append_notes(ledger_file, 1, "newest")  # not checkpointed yet: sound, and said so
    result = verify(ledger_file, checkpoint_hub, "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["ok"] and report["checkpoints"]["checked"] == 2
    assert report["checkpoints"]["newest"]["checkpoint"]["seq"] == 9
    assert "events after seq 9 are in no checkpoint yet" in verify(ledger_file, checkpoint_hub).stdout


def test_a_deleted_tail_is_reported(ledger_file, signing_key, checkpoint_hub):
    cp = checkpoint(ledger_file, signing_key, checkpoint_hub)
    cut = copy_ledger(ledger_file, "cut.db")
    delete_tail(cut, keep=4)
    assert ledger(cut, "verify").exit_code == 0  # what the chain alone cannot see
    result = verify(cut, checkpoint_hub)
    assert_names(result, cp, "truncated")
    assert "truncated: the ledger ends at seq 4, the checkpoint saw seq 6 (events deleted" in result.stderr


def test_an_old_backup_put_back_is_reported(ledger_file, signing_key, checkpoint_hub):
    backup = copy_ledger(ledger_file, "backup.db")
    append_notes(ledger_file, 4, "after the backup")
    cp = checkpoint(ledger_file, signing_key, checkpoint_hub)
    assert ledger(backup, "verify").exit_code == 0
    assert_names(verify(backup, checkpoint_hub), cp, "the ledger ends at seq 6, the checkpoint saw seq 10")

    # The backup put back and appended to until it is as long again: a fork.
    append_notes(backup, 5, "another history")
    result = verify(backup, checkpoint_hub)
    assert_names(result, cp, "rewritten: the event at seq 10 has hash")
    assert "an older copy restored and appended to" in result.stderr


def test_an_edited_and_rehashed_chain_is_reported(ledger_file, signing_key, checkpoint_hub):
    early = checkpoint(ledger_file, signing_key, checkpoint_hub)
    append_notes(ledger_file, 2, "more")
    checkpoint(ledger_file, signing_key, checkpoint_hub)
    forged = copy_ledger(ledger_file, "forged.db")
    rewrite_and_rehash(forged, 2, '{"text":"nothing happened here"}')
    store = SQLiteStore(forged)
    assert [e.data["text"] for e in store.read_all()][1] == "nothing happened here"
    store.close()
    assert ledger(forged, "verify").exit_code == 0  # the chain verifies: every hash was recomputed
    result = verify(forged, checkpoint_hub)
    # Both checkpoints are contradicted; the oldest is named: where the histories part.
    assert_names(result, early, "rewritten: the event at seq 6 has hash")
    assert "(and 1 more)" in result.stderr
    problems = json.loads(verify(forged, checkpoint_hub, "--json").stdout)["checkpoints"]["problems"]
    assert [(p["kind"], p["checkpoint"]["seq"]) for p in problems] == [("rewritten", 6), ("rewritten", 8)]


def test_a_forged_checkpoint_is_reported(ledger_file, signing_key, checkpoint_hub, tmp_path):
    checkpoint(ledger_file, signing_key, checkpoint_hub)
    # Someone with push access but without the reconciler's key vouches for a shorter ledger.
    stranger = tmp_path / "stranger"
    stranger.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()))
    store = SQLiteStore(ledger_file)
    fake = sign(SigningKey.load(stranger), seq=3, hash=store.hash_at(3), signer=SIGNER, when=datetime.now(UTC))
    store.close()
    with CheckpointRepo(str(checkpoint_hub), REF) as repo:
        repo.publish(fake, "checkpoint: seq 3\n")
    result = verify(ledger_file, checkpoint_hub)
    assert result.exit_code == 1
    assert f"at seq 3 signed by {SIGNER} ({REF}@" in result.stderr
    assert "is untrusted: its key SHA256:" in result.stderr and "is not in" in result.stderr

    # And one whose text was changed after it was signed (a ledger cut at 4 made to look whole).
    with CheckpointRepo(str(checkpoint_hub), REF) as repo:
        honest = repo.history()[0]
        body = honest.body.replace(b"seq 6", b"seq 4")
        repo.publish(type(honest)(body, honest.signature), "checkpoint: seq 4\n")
    problems = json.loads(verify(ledger_file, checkpoint_hub, "--json").stdout)["checkpoints"]["problems"]
    assert [p["kind"] for p in problems] == ["untrusted", "forged"]
    assert "forged or altered" in problems[1]["reason"]


def test_checkpoints_from_files_and_pubsub_archives(ledger_file, signing_key, tmp_path):
    out = tmp_path / "cp"
    result = ledger(ledger_file, "checkpoint", "--out", str(out), key=signing_key)
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("tpu-ledger checkpoint v1") and Path(f"{out}.sig").exists()
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(ledger(ledger_file, "checkpoint", "--allowed-signer", key=signing_key).stdout)

    ok = ledger(ledger_file, "verify", "--from", str(out), "--allowed-signers", str(allowed))
    assert ok.exit_code == 0 and "checkpoints: 1 agree" in ok.stdout
    # The same checkpoint as Pub/Sub carries it, archived one message per line.
    archive = tmp_path / "archive.jsonl"
    archive.write_text(json.dumps({"checkpoint": out.read_text(), "signature": Path(f"{out}.sig").read_text()})
                       + "\nnot json\n")
    result = ledger(ledger_file, "verify", "--from", str(archive), "--allowed-signers", str(allowed), "--json")
    problems = json.loads(result.stdout)["checkpoints"]["problems"]
    assert result.exit_code == 1 and [(p["source"], p["kind"]) for p in problems] == [(f"{archive}:2", "unreadable")]

    cut = copy_ledger(ledger_file, "cut.db")
    delete_tail(cut, keep=5)
    result = ledger(cut, "verify", "--from", str(out), "--allowed-signers", str(allowed))
    assert result.exit_code == 1 and f"signed by {SIGNER} ({out}): truncated: the ledger ends at seq 5" in result.stderr


def test_usage_errors_say_what_to_do(ledger_file, signing_key, tmp_path):
    nowhere = ledger(ledger_file, "checkpoint", key=signing_key)
    assert nowhere.exit_code == 2 and "nowhere to publish" in nowhere.stderr
    no_trust = ledger(ledger_file, "verify", "--from", str(tmp_path / "missing"))
    assert no_trust.exit_code == 2 and "no such file, and not a ref" in no_trust.stderr
    bad_ref = ledger(ledger_file, "checkpoint", "--checkpoint-ref", "ledger", key=signing_key)
    assert bad_ref.exit_code == 2 and "bad checkpoint ref 'ledger'" in bad_ref.stderr


def test_no_checkpoint_or_no_trusted_keys_fails_the_check(ledger_file, signing_key, checkpoint_hub, tmp_path):
    result = verify(ledger_file, checkpoint_hub)
    assert result.exit_code == 1 and "no checkpoint found" in result.stderr
    bare = tmp_path / "bare.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    checkpoint(ledger_file, signing_key, bare)
    result = verify(ledger_file, bare)
    assert result.exit_code == 2 and "has no .ledger/allowed_signers on its default branch" in result.stderr


def test_a_rolled_back_ref_is_put_back_by_the_publisher(ledger_file, signing_key, checkpoint_hub):
    key = SigningKey.load(signing_key)
    store = SQLiteStore(ledger_file)
    with CheckpointRepo(str(checkpoint_hub), REF) as repo:
        def publish(n: int) -> str:
            append_notes(ledger_file, 1, f"step {n}")
            head = store.head()
            return repo.publish(sign(key, seq=head, hash=store.hash_at(head), signer=SIGNER,
                                     when=datetime.now(UTC)), f"checkpoint {n}\n")

        a, b = publish(1), publish(2)
        git(checkpoint_hub, "update-ref", REF, a)  # someone with push rights moves the ref back
        c = publish(3)
    store.close()
    assert git(checkpoint_hub, "rev-list", "--first-parent", REF).split() == [c, b, a]


def test_the_private_key_never_reaches_the_hub_or_the_output(ledger_file, signing_key, checkpoint_hub):
    result = ledger(ledger_file, "checkpoint", "--json", key=signing_key, hub=checkpoint_hub)
    secret_lines = [line for line in signing_key.read_text().splitlines() if not line.startswith("-----")]
    objects = subprocess.run(["git", "-C", str(checkpoint_hub), "cat-file", "--batch-all-objects", "--batch"],
                             capture_output=True, check=True).stdout.decode("utf-8", "replace")
    for line in secret_lines:
        assert line not in objects and line not in result.output


def test_reconcile_publishes_a_checkpoint_when_it_stops(ledger_file, signing_key, checkpoint_hub, tmp_path):
    """A real `ledger reconcile --once` process: nothing to act on, and at shutdown the head
    is signed and pushed to the hub."""
    env = {"LEDGER_STORE": f"sqlite:///{ledger_file}", "LEDGER_SSH_KEY": str(signing_key),
           "LEDGER_CHECKPOINT_REPO": str(checkpoint_hub), "LEDGER_LOG_DIR": str(tmp_path / "logs"),
           "PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "ledger", "reconcile", "--once", "--id", SIGNER,
                           "--tpu-endpoint", "127.0.0.1:9", "--lease-ttl", "0"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"at seq 6 signed by {SIGNER}: published to git {REF}" in done.stderr  # a log line
    assert git(checkpoint_hub, "show", f"{REF}:checkpoint").splitlines()[1] == "seq 6"
    assert verify(ledger_file, checkpoint_hub).exit_code == 0


def test_checkpoints_follow_the_head_while_running_and_once_more_at_the_end(ledger_file, signing_key, checkpoint_hub):
    thread = start_checkpoints(f"sqlite:///{ledger_file}", signing_key, SIGNER, repo=str(checkpoint_hub), ref=REF,
                               project=None, topic=None, every=0.05)
    assert thread is not None

    def seqs() -> list[int]:
        out = git(checkpoint_hub, "log", "--format=%s", REF) if git(checkpoint_hub, "for-each-ref", REF) else ""
        return [int(line.split()[2]) for line in out.splitlines()]

    wait_for(lambda: seqs() == [6])
    append_notes(ledger_file, 2, "while running")
    wait_for(lambda: seqs()[:1] == [8])
    append_notes(ledger_file, 1, "just before shutdown")
    last = thread.close()
    assert last is not None and last.checkpoint.seq == 9 and not last.failed
    assert seqs() == [9, 8, 6]  # one per head, newest first: an unchanged head is not signed again


def test_an_unchanged_head_is_not_signed_again(ledger_file, signing_key, checkpoint_hub):
    store = SQLiteStore(ledger_file)
    checkpointer = Checkpointer(store, SigningKey.load(signing_key), SIGNER, [GitSink(str(checkpoint_hub), REF)])
    try:
        assert checkpointer.publish().checkpoint.seq == 6
        assert checkpointer.publish() is None
        assert checkpointer.publish(force=True).checkpoint.seq == 6  # `ledger checkpoint` by hand
    finally:
        checkpointer.close()
        store.close()
    assert len(git(checkpoint_hub, "rev-list", REF).split()) == 2


def test_a_token_in_the_repo_url_never_shows(ledger_file, signing_key, checkpoint_hub):
    url = "https://x-access-token:s3cr3t-token@127.0.0.1:9/lab/jobs.git"  # nothing listens there
    result = ledger(ledger_file, "checkpoint", "--checkpoint-repo", url, key=signing_key)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert "was not published: cannot fetch checkpoints from https://x-access-token:***@" in result.stderr
    assert "s3cr3t-token" not in result.output and "x-access-token:***@127.0.0.1:9" in result.stderr
