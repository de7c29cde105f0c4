"""Admin overrides signed with SSH keys: what is signed, and the check of a signature.

An operator's `ledger cancel`, `admit`, `resume` or `rerun` may carry an OpenSSH signature
(`ssh-keygen -Y sign`, namespace `tpu-ledger-override`) by a key of the jobs repository's
allowed-signers file, the file signed merges are checked against. The signed statement
names the action, the job, the version of the job's stream it was decided on (so a
signature cannot be replayed onto a later state of the job), the reason, the signer and the
time, as canonical JSON. The ledger keeps the statement and the signature in the event
(`OverrideSignature`), and the verified principal as the event's actor.

Verification reuses the checkpoints' verifier (ledger.checkpoints.sshsig, .signers). Pure.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ledger.checkpoints.signers import AllowedSigners
from ledger.checkpoints.sshsig import Signature, SignatureError
from ledger.errors import LedgerError
from ledger.events import dumps
from ledger.events.data import OverrideSignature

NAMESPACE = "tpu-ledger-override"
KIND = "tpu-ledger override v1"
# The overrides an operator can sign: `ledger cancel`, `admit`, `resume`, `rerun`.
ACTIONS = ("cancel_requested", "admitted", "resumed", "rerun")


class SignatureRefused(LedgerError):
    """An override whose signature does not prove who asked for it: nothing is recorded."""


@dataclass(frozen=True, slots=True)
class Statement:
    action: str  # the event type the override appends
    job: str
    version: int  # the job stream's version it was decided on
    reason: str
    signer: str  # the principal, as the allowed-signers file names the key
    time: str  # UTC, to the second

    def text(self) -> bytes:
        return dumps({"kind": KIND, **asdict(self)}).encode()

    @classmethod
    def parse(cls, text: str | bytes) -> Statement:
        try:
            data = json.loads(text)
            if data.pop("kind") != KIND:
                raise ValueError(f"not a {KIND} statement")
            statement = cls(**data)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SignatureRefused(f"not an override statement: {exc}") from exc
        if statement.text() != (text if isinstance(text, bytes) else text.encode()):
            raise SignatureRefused("the statement is not in canonical form")
        return statement


def verify(statement: Statement, armored: str, allowed: AllowedSigners, at: float) -> Signature:
    """The signature, when it is the statement's signer's, by a key `allowed` trusts for
    overrides at time `at`; SignatureRefused naming why not."""
    try:
        signature = Signature.from_armor(armored)
    except SignatureError as exc:
        raise SignatureRefused(f"the override's signature cannot be read: {exc}") from exc
    if (why := signature.verify(statement.text(), NAMESPACE)) is not None:
        raise SignatureRefused(f"the override's signature does not verify: {why}")
    if (why := allowed.check(statement.signer, signature.public_key, NAMESPACE, at)) is not None:
        raise SignatureRefused(f"the override's signer {statement.signer!r} is not trusted: {why}",
                               hint=f"add the key to {allowed.where} by pull request, with "
                                    f'namespaces="{NAMESPACE}" (or without namespaces)')
    return signature


def recorded(statement: Statement, signature: Signature, armored: str) -> OverrideSignature:
    """What the event keeps of a verified signature."""
    return OverrideSignature(signer=statement.signer, key=signature.key_fingerprint,
                             statement=statement.text().decode(), signature=armored)


def problem(signed: OverrideSignature, action: str, job: str, version: int) -> str | None:
    """Why a recorded signature does not vouch for this event (None: it does, by the key it
    names; whether that key is trusted is the allowed-signers file's to say)."""
    try:
        statement = Statement.parse(signed.statement)
        signature = Signature.from_armor(signed.signature)
    except (SignatureRefused, SignatureError) as exc:
        return str(exc)
    if (statement.action, statement.job, statement.version) != (action, job, version):
        return (f"the statement signs {statement.action} of {statement.job} at version {statement.version}, "
                f"not {action} of {job} at version {version}")
    if statement.signer != signed.signer or signature.key_fingerprint != signed.key:
        return "the signer or key recorded is not the one that signed"
    return signature.verify(statement.text(), NAMESPACE)
