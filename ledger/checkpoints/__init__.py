"""Signed checkpoints of the ledger's head, published outside the ledger.

A hash chain shows an event altered in place, but not the last events deleted, nor an older
copy of the ledger put back, nor a whole chain edited and re-hashed: each of those leaves a
chain that verifies. Transparency logs (Certificate Transparency, Sigstore's Rekor) answer
this by publishing signed checkpoints of their head; so does tpu-ledger. docs/reliability.md
has the threat model.

- `note`: the checkpoint text and its signature (pure).
- `sshsig`, `signers`: OpenSSH signatures and allowed-signers files (pure, plus key loading).
- `check`: published checkpoints against the ledger (pure).
- `gitref`, `files`, `publish`: the shell: a git ref of the jobs repository, files, Pub/Sub.
"""

from ledger.checkpoints.check import Verdict, check, check_all
from ledger.checkpoints.gitref import ALLOWED_SIGNERS_PATH, DEFAULT_REF, CheckpointRepo
from ledger.checkpoints.note import NAMESPACE, Checkpoint, Signed, sign
from ledger.checkpoints.publish import Checkpointer, CheckpointThread, GitSink, PubSubSink
from ledger.checkpoints.signers import AllowedSigners, SignersError
from ledger.checkpoints.sshsig import SigningKey

__all__ = [
    "Verdict", "check", "check_all", "ALLOWED_SIGNERS_PATH", "DEFAULT_REF", "CheckpointRepo",
    "NAMESPACE", "Checkpoint", "Signed", "sign", "Checkpointer", "CheckpointThread", "GitSink",
    "PubSubSink", "AllowedSigners", "SignersError", "SigningKey",
]
