"""The checkpoint text and the pure check: each way a ledger can disagree with a checkpoint
gets its own verdict, naming the checkpoint by time, seq and signer."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from ledger.checkpoints import (
    NAMESPACE,
    AllowedSigners,
    Checkpoint,
    Signed,
    SigningKey,
    check,
    sign,
    signers,
)
from ledger.checkpoints.check import FORGED, REWRITTEN, SOUND, TRUNCATED, UNREADABLE, UNTRUSTED
from ledger.checkpoints.note import NoteError

WHEN = datetime(2026, 11, 22, 12, 0, 5, 123456, tzinfo=UTC)
HASHES = {seq: f"{seq:064x}" for seq in range(1, 11)}  # a ledger of 10 events, by its hashes


@pytest.fixture
def key(signing_key: Path) -> SigningKey:
    return SigningKey.load(signing_key)


@pytest.fixture
def allowed(key: SigningKey) -> AllowedSigners:
    return signers.parse(AllowedSigners(()).line_for("recon-a", key.public_key, NAMESPACE) + "\n", "allowed_signers")


def verdict(signed: Signed, allowed: AllowedSigners, head: int = 10, hashes: dict = HASHES):
    return check(signed, head=head, hash_at=hashes.get, allowed=allowed)


def test_the_text_reads_back_exactly_and_is_what_is_signed(key: SigningKey):
    signed = sign(key, seq=7, hash=HASHES[7], signer="recon-a", when=WHEN)
    assert signed.body.decode() == (
        "tpu-ledger checkpoint v1\nseq 7\n"
        f"hash {HASHES[7]}\ntime 2026-11-22T12:00:05Z\nsigner recon-a\nkey {key.fingerprint}\n")
    checkpoint = Checkpoint.parse(signed.body)
    assert checkpoint.body() == signed.body
    assert checkpoint.label == "checkpoint of 2026-11-22T12:00:05Z at seq 7 signed by recon-a"
    assert checkpoint.epoch == datetime(2026, 11, 22, 12, 0, 5, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("body, why", [
    (b"hello\n", "does not start with"),
    (b"tpu-ledger checkpoint v1\nseq 1\n", "expected the lines"),
    (b"tpu-ledger checkpoint v1\nseq 01\nhash " + b"a" * 64 + b"\ntime 2026-11-22T12:00:05Z\nsigner a\nkey SHA256:"
     + b"A" * 43 + b"\n", "not a number"),
    (b"tpu-ledger checkpoint v1\nseq 1\nhash ABC\ntime 2026-11-22T12:00:05Z\nsigner a\nkey SHA256:" + b"A" * 43 + b"\n",
     "64 lowercase hex"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_text_that_is_not_a_checkpoint_is_refused(body: bytes, why: str):
    with pytest.raises(NoteError, match=why):
        Checkpoint.parse(body)


def test_a_signer_name_that_would_not_read_back_is_refused_when_signing(key: SigningKey):
    with pytest.raises(NoteError, match="spaces"):
        sign(key, seq=1, hash=HASHES[1], signer="recon a", when=WHEN)


def test_each_kind_of_disagreement(key: SigningKey, allowed: AllowedSigners):
    at7 = sign(key, seq=7, hash=HASHES[7], signer="recon-a", when=WHEN)
    assert verdict(at7, allowed).kind == SOUND
    assert verdict(at7, allowed, head=7).kind == SOUND  # the head itself

    cut = verdict(at7, allowed, head=5)
    assert cut.kind == TRUNCATED and "the ledger ends at seq 5, the checkpoint saw seq 7" in cut.reason

    # A head that claims more than the events hold (PostgreSQL's head row after a DELETE).
    missing = verdict(at7, allowed, hashes={seq: h for seq, h in HASHES.items() if seq < 7})
    assert missing.kind == TRUNCATED and "the ledger has no event at seq 7, which the checkpoint saw" in missing.reason

    other = {**HASHES, 7: "f" * 64}
    forked = verdict(at7, allowed, hashes=other)
    assert forked.kind == REWRITTEN and f"has hash {'f' * 12}, the checkpoint says {HASHES[7][:12]}" in forked.reason
    assert forked.line().startswith("checkpoint of 2026-11-22T12:00:05Z at seq 7 signed by recon-a: rewritten: ")

    edited = Signed(at7.body.replace(b"seq 7", b"seq 8"), at7.signature, "refs/ledger/checkpoints@abc")
    assert verdict(edited, allowed).kind == FORGED and "forged or altered" in verdict(edited, allowed).reason
    assert verdict(Signed(at7.body, ""), allowed).kind == FORGED
    assert verdict(Signed(b"junk", at7.signature, "x"), allowed).kind == UNREADABLE


def test_a_checkpoint_by_a_key_nobody_trusts_proves_nothing(key: SigningKey, allowed: AllowedSigners):
    stranger = SigningKey(ec.generate_private_key(ec.SECP256R1()))
    signed = sign(stranger, seq=3, hash=HASHES[3], signer="recon-a", when=WHEN)
    result = verdict(signed, allowed)
    assert result.kind == UNTRUSTED and f"its key {stranger.fingerprint} is not in allowed_signers" in result.reason
    impostor = sign(key, seq=3, hash=HASHES[3], signer="recon-b", when=WHEN)  # a trusted key, another name
    assert verdict(impostor, allowed).kind == UNTRUSTED


def test_the_key_named_in_the_text_must_be_the_one_that_signed(key: SigningKey, allowed: AllowedSigners):
    stranger = SigningKey(ec.generate_private_key(ec.SECP256R1()))
    honest = sign(key, seq=3, hash=HASHES[3], signer="recon-a", when=WHEN)
    body = honest.body.replace(key.fingerprint.encode(), stranger.fingerprint.encode())
    relabelled = Signed(body, stranger.sign(body, NAMESPACE).armor())
    result = verdict(relabelled, allowed)
    assert result.kind == UNTRUSTED  # signed by the stranger, who is not trusted either way
    mismatched = Signed(body, key.sign(body, NAMESPACE).armor())
    assert verdict(mismatched, allowed).kind == FORGED
    assert "names key" in verdict(mismatched, allowed).reason
