"""The reconciler's SSH identity: a private key on the ledger host, its public half sent to
nodes in the `ssh-keys` metadata at creation, as Google Cloud's guest agent expects."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def ensure_key(path: Path) -> str:
    """Create an ECDSA key at `path` if missing (paramiko cannot make Ed25519); return the
    public key line `type base64 comment`."""
    import paramiko

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path.parent, 0o700)
        key = paramiko.ECDSAKey.generate(bits=256)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            key.write_private_key(f)
    return load_public(path)


def load_public(path: Path) -> str:
    import paramiko

    for cls in (paramiko.ECDSAKey, paramiko.RSAKey, paramiko.Ed25519Key):
        try:
            key = cls.from_private_key_file(str(path))
        except (paramiko.SSHException, ValueError):
            continue
        return f"{key.get_name()} {key.get_base64()} tpu-ledger"
    raise ValueError(f"{path} is not a private key paramiko can read")


class JobKeys:
    """One SSH key per job, made when its TPU is created: the TPU's `ssh-keys` metadata holds
    that key's public half only, so a job's host never holds a key that opens another job's
    hosts (nor the reconciler's key, which would open them all).

    The private halves live under `root` (defaults.JOB_KEYS_DIR, beside the reconciler's
    key), in a folder named by a digest of the job id: never in the ledger, never in events.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, job_id: str) -> Path:
        digest = hashlib.sha256(job_id.encode()).hexdigest()[:24]
        return self.root / digest / "id_ecdsa"

    def public(self, job_id: str) -> str:
        """The job's public key line, the key made first if the job has none yet."""
        return ensure_key(self.path(job_id))

    def existing(self, job_id: str) -> Path | None:
        """The job's private key when one was made (its TPU was created by us), else None."""
        p = self.path(job_id)
        return p if p.is_file() else None
