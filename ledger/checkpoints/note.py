"""A checkpoint: the ledger's head (seq and hash) at a time, named by its signer, as text.

Like a transparency log's signed tree head, it is a short note whose exact bytes are signed:

    tpu-ledger checkpoint v1
    seq 1234
    hash 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    time 2026-11-22T12:00:00Z
    signer recon-a
    key SHA256:tlILB/BSY7YLFTT2JJOJ7U1VBwFWxzKtCIQfwNMQow8

The signature beside it is an armored OpenSSH signature in the `tpu-ledger-checkpoint`
namespace, so `ssh-keygen -Y verify -n tpu-ledger-checkpoint -I recon-a -f allowed_signers
-s checkpoint.sig < checkpoint` checks one by hand. Because every event's hash covers the one
before it, the hash at `seq` commits to the whole history up to `seq`. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from ledger.checkpoints.sshsig import SigningKey
from ledger.fanout.envelope import CHECKPOINT_KIND, KIND_ATTRIBUTE, Message

NAMESPACE = "tpu-ledger-checkpoint"
HEADER = "tpu-ledger checkpoint v1"
FIELDS = ("seq", "hash", "time", "signer", "key")
_HASH = re.compile(r"[0-9a-f]{64}")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
_KEY = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")


class NoteError(ValueError):
    """Text that is not a checkpoint of this format."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    seq: int
    hash: str  # the hash of the event at seq (the genesis hash at 0)
    time: str  # when it was signed, UTC to the second
    signer: str  # the principal, as the allowed-signers file names it
    key: str  # the signing key's fingerprint

    def body(self) -> bytes:
        lines = [HEADER, *(f"{name} {getattr(self, name)}" for name in FIELDS)]
        return ("\n".join(lines) + "\n").encode()

    @classmethod
    def parse(cls, body: bytes) -> Checkpoint:
        try:
            lines = body.decode("utf-8").split("\n")
        except UnicodeDecodeError:
            raise NoteError("not UTF-8 text") from None
        if lines[-1:] == [""]:
            lines.pop()
        if not lines or lines[0] != HEADER:
            raise NoteError(f"does not start with {HEADER!r}")
        found = [line.partition(" ") for line in lines[1:]]
        if [name for name, _, _ in found] != list(FIELDS):
            raise NoteError(f"expected the lines {', '.join(FIELDS)} in that order")
        values = {name: value for name, _, value in found}
        if not values["seq"].isdigit() or str(int(values["seq"])) != values["seq"]:
            raise NoteError(f"seq {values['seq']!r} is not a number")
        if not _HASH.fullmatch(values["hash"]):
            raise NoteError("hash is not 64 lowercase hex digits")
        if not _TIME.fullmatch(values["time"]):
            raise NoteError(f"time {values['time']!r} is not YYYY-MM-DDTHH:MM:SSZ")
        if not values["signer"] or not values["signer"].isprintable() or " " in values["signer"]:
            raise NoteError("signer is empty or has spaces")
        if not _KEY.fullmatch(values["key"]):
            raise NoteError("key is not an OpenSSH SHA256 fingerprint")
        return cls(int(values["seq"]), values["hash"], values["time"], values["signer"], values["key"])

    @property
    def epoch(self) -> float:
        return datetime.strptime(self.time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()

    @property
    def label(self) -> str:
        """How a person names it: when, where in the ledger, by whom."""
        return f"checkpoint of {self.time} at seq {self.seq} signed by {self.signer}"

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in FIELDS}


@dataclass(frozen=True, slots=True)
class Signed:
    """A checkpoint's exact bytes, its armored signature, and where it was found."""

    body: bytes
    signature: str
    source: str = ""  # "refs/ledger/checkpoints@1a2b3c4d5e6f", a file name, ...

    def to_json(self) -> dict:
        """What Pub/Sub carries and what an archive of checkpoints holds, one per line."""
        return {"checkpoint": self.body.decode("utf-8"), "signature": self.signature}

    @classmethod
    def from_json(cls, value: object, source: str) -> Signed:
        if not isinstance(value, dict) or not isinstance(value.get("checkpoint"), str) \
                or not isinstance(value.get("signature"), str):
            raise NoteError('expected {"checkpoint": TEXT, "signature": ARMORED SIGNATURE}')
        return cls(value["checkpoint"].encode("utf-8"), value["signature"], source)


def utc_seconds(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sign(key: SigningKey, *, seq: int, hash: str, signer: str, when: datetime) -> Signed:
    """A signed checkpoint of the head (seq, hash) at `when`."""
    checkpoint = Checkpoint(seq, hash, utc_seconds(when), signer, key.fingerprint)
    body = checkpoint.body()
    Checkpoint.parse(body)  # a signer name that would not read back is refused here, not later
    return Signed(body, key.sign(body, NAMESPACE).armor())


def pubsub_message(signed: Signed, checkpoint: Checkpoint) -> Message:
    """The checkpoint on the events' topic: subscribers tell it from an event by its `kind`
    attribute (events carry none) and skip it; an auditor's subscription archives it."""
    return Message(
        data=json.dumps(signed.to_json(), sort_keys=True).encode(),
        attributes={KIND_ATTRIBUTE: CHECKPOINT_KIND, "seq": str(checkpoint.seq), "signer": checkpoint.signer},
        ordering_key="_checkpoints",
    )
