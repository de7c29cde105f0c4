"""Does the ledger agree with what was published about it? Pure: the ledger is passed in as
its head and a `hash_at(seq)` function.

A checkpoint signed at seq S with hash H says "the ledger had S events, the last hashing to
H". Since each event's hash covers its predecessor's, H fixes all of events 1..S. So:
- a ledger whose head is below S lost events: truncated, or an older copy was restored;
- a ledger whose event S hashes differently has another history up to S: it was rewritten
  (edited and re-hashed), or an older copy was restored and appended to (a fork);
- a checkpoint whose signature does not verify, or whose key is not an allowed signer for
  the principal it names, proves nothing and is reported as forged or untrusted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ledger.checkpoints.note import NAMESPACE, Checkpoint, NoteError, Signed
from ledger.checkpoints.signers import AllowedSigners
from ledger.checkpoints.sshsig import Signature, SignatureError
from ledger.events import GENESIS_HASH

# What a verdict says, from the ledger's point of view.
SOUND, UNREADABLE, FORGED, UNTRUSTED, TRUNCATED, REWRITTEN = (
    "sound", "unreadable", "forged", "untrusted", "truncated", "rewritten")


@dataclass(frozen=True, slots=True)
class Verdict:
    signed: Signed
    checkpoint: Checkpoint | None  # None when it could not be read
    kind: str
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.kind == SOUND

    @property
    def label(self) -> str:
        where = f" ({self.signed.source})" if self.signed.source else ""
        if self.checkpoint is None:
            return f"checkpoint{where}"
        return f"{self.checkpoint.label}{where}"

    def line(self) -> str:
        """One line for a person: the checkpoint, then what is wrong."""
        return f"{self.label}: {self.kind}: {self.reason}" if self.reason else f"{self.label}: {self.kind}"

    def to_dict(self) -> dict:
        return {"source": self.signed.source, "kind": self.kind, "ok": self.ok, "reason": self.reason,
                "checkpoint": None if self.checkpoint is None else self.checkpoint.to_dict()}


def _short(hash_: str) -> str:
    return hash_[:12]


def check(signed: Signed, *, head: int, hash_at: Callable[[int], str | None],
          allowed: AllowedSigners) -> Verdict:
    """One published checkpoint against the ledger (head and hashes) and the trusted keys."""
    try:
        checkpoint = Checkpoint.parse(signed.body)
    except NoteError as exc:
        return Verdict(signed, None, UNREADABLE, f"not a checkpoint: {exc}")
    try:
        signature = Signature.from_armor(signed.signature)
    except SignatureError as exc:
        return Verdict(signed, checkpoint, FORGED, f"its signature cannot be read: {exc}")
    if (why := signature.verify(signed.body, NAMESPACE)) is not None:
        return Verdict(signed, checkpoint, FORGED, why)
    if signature.key_fingerprint != checkpoint.key:
        return Verdict(signed, checkpoint, FORGED,
                       f"it names key {checkpoint.key} but was signed by {signature.key_fingerprint}")
    if (why := allowed.check(checkpoint.signer, signature.public_key, NAMESPACE, checkpoint.epoch)) is not None:
        return Verdict(signed, checkpoint, UNTRUSTED, why)
    seq = checkpoint.seq
    actual = GENESIS_HASH if seq == 0 else hash_at(seq) if seq <= head else None
    if actual is None:  # past the head, or a head that claims more than the events hold
        what = f"ends at seq {head}, the checkpoint saw seq {seq}" if seq > head else \
            f"has no event at seq {seq}, which the checkpoint saw"
        return Verdict(signed, checkpoint, TRUNCATED,
                       f"the ledger {what} (events deleted, or an older copy restored)")
    if actual != checkpoint.hash:
        return Verdict(signed, checkpoint, REWRITTEN,
                       f"the event at seq {seq} has hash {_short(actual)}, the checkpoint says "
                       f"{_short(checkpoint.hash)} (history edited and re-hashed, or an older copy "
                       "restored and appended to)")
    return Verdict(signed, checkpoint, SOUND)


def check_all(published: Iterable[Signed], *, head: int, hash_at: Callable[[int], str | None],
              allowed: AllowedSigners) -> list[Verdict]:
    """Every checkpoint, in the order given (publication order: the first bad one is where the
    ledger and what was published about it part ways)."""
    return [check(s, head=head, hash_at=hash_at, allowed=allowed) for s in published]
