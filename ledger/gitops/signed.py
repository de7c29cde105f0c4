"""A commit's SSH signature, checked by the project's one SSHSIG verifier
(ledger.checkpoints.sshsig, the one that checks checkpoints and signed overrides) against the
branch's allowed-signers file (ledger.checkpoints.signers), as `git verify-commit` would:
namespace `git`, the signed payload is the commit object without its `gpgsig` header, the
key's validity judged at the commit's committer time. Pure: the raw commit object in,
a `Signature` verdict out.

OpenPGP signatures (GitHub's web-flow merges) are not SSH signatures: git and gpg check those
(ledger.gitops.ingest, ledger.forge.webflow).
"""

from __future__ import annotations

from ledger.checkpoints import signers, sshsig
from ledger.gitops.approval import Signature

NAMESPACE = "git"
_HEADER = b"gpgsig "


def split_signed(raw: bytes) -> tuple[bytes, str | None]:
    """(the payload git signed, the armored signature or None) of a raw commit object
    (`git cat-file commit`): the `gpgsig` header and its continuation lines are what the
    payload lacks; everything else, the message included, is signed byte for byte."""
    head, sep, message = raw.partition(b"\n\n")
    kept: list[bytes] = []
    signature: list[bytes] | None = None
    inside = False
    for line in head.split(b"\n"):
        if inside and line.startswith(b" "):
            signature.append(line[1:])  # type: ignore[union-attr]
            continue
        inside = False
        if signature is None and line.startswith(_HEADER):
            signature, inside = [line[len(_HEADER):]], True
            continue
        kept.append(line)
    if signature is None:
        return raw, None
    return b"\n".join(kept) + sep + message, b"\n".join(signature).decode("utf-8", "replace")


def committed_at(raw: bytes) -> float:
    """The committer time of a raw commit object (seconds since the epoch; 0 when absent)."""
    for line in raw.partition(b"\n\n")[0].split(b"\n"):
        if line.startswith(b"committer "):
            parts = line.rsplit(b" ", 2)
            if len(parts) == 3 and parts[1].isdigit():
                return float(parts[1])
    return 0.0


def is_ssh(armored: str) -> bool:
    return armored.lstrip().startswith(sshsig.ARMOR_BEGIN)


def ssh_verdict(payload: bytes, armored: str, allowed_signers: str, at: float) -> Signature:
    """good (with the principal the file lets the key sign as), untrusted (a valid signature by
    a key the file does not list for `git` at that time), or bad (it does not verify)."""
    try:
        signature = sshsig.Signature.from_armor(armored)
    except sshsig.SignatureError as exc:
        return Signature("bad", detail=str(exc))
    key = signature.key_fingerprint
    why = signature.verify(payload, NAMESPACE)
    if why is not None:
        return Signature("bad", key=key, detail=f"Signature verification failed: {why}")
    try:
        allowed = signers.parse(allowed_signers, ".ledger/allowed_signers")
    except signers.SignersError as exc:
        return Signature("untrusted", key=key, detail=str(exc))
    for principal in allowed.principals_of(signature.public_key, NAMESPACE):
        if allowed.check(principal, signature.public_key, NAMESPACE, at) is None:
            kind = sshsig.key_type(signature.public_key).removeprefix("ssh-").upper()
            return Signature("good", principal, key, f'Good "git" signature for {principal} with {kind} key {key}')
    return Signature("untrusted", key=key)  # no principal matched
