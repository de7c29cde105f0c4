"""The reconciler's SSH identity: a private key on the ledger host, its public half sent to
nodes in the `ssh-keys` metadata at creation, as Google Cloud's guest agent expects."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric import ec

from ledger.checkpoints.sshsig import SigningKey, public_line

if TYPE_CHECKING:
    import paramiko


def ensure_key(path: Path) -> str:
    """Create an ECDSA key at `path` if missing (paramiko cannot make Ed25519); return the
    public key line `type base64 comment`."""
    if not path.exists():
        import paramiko  # start-up time: paramiko (0.2 s CPU) loads only to make a key, not to read one

        _write_key(path, paramiko.ECDSAKey.generate(bits=256))
    return load_public(path)


def _write_key(path: Path, key: paramiko.PKey) -> None:
    """Write `key` at `path` (0600, folder 0700); when another thread or process made the
    file first, keep theirs: both then read the same key."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        key.write_private_key(f)


def load_public(path: Path) -> str:
    """The public key line of the private key at `path` (PEM as paramiko writes it, or
    OpenSSH's format), read with `cryptography`: a reconciler that only checks its key at
    start does not load paramiko. A key it cannot read is a one-line error (KeyProblem)."""
    return f"{public_line(SigningKey.load(path).public_key)} tpu-ledger"


# The order of NIST P-256: a derived scalar is taken modulo it.
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def derive_job_key(seed: bytes, job_id: str) -> paramiko.ECDSAKey:
    """The job's ECDSA P-256 key, derived from `seed` (the reconciler's private key file) and
    the job id: every reconciler holding the same key derives the same job key, so a peer
    that takes a job over (leases) reaches its hosts without any key being shared or stored
    in the ledger. Knowing a job key tells nothing about the seed or another job's key."""
    import paramiko  # start-up time: paramiko (0.2 s CPU) loads only to make a key, not to read one

    digest = hmac.new(seed, b"tpu-ledger job key v1\0" + job_id.encode(), hashlib.sha512).digest()
    private = ec.derive_private_key(int.from_bytes(digest, "big") % (_P256_ORDER - 1) + 1, ec.SECP256R1())
    return paramiko.ECDSAKey(vals=(private, private.public_key()))


class JobKeys:
    """One SSH key per job, made when its TPU is created: the TPU's `ssh-keys` metadata holds
    that key's public half only, so a job's host never holds a key that opens another job's
    hosts (nor the reconciler's key, which would open them all).

    Keys are derived from the reconciler's own key (`derive_job_key`) and cached under `root`
    (beside the reconciler's key), in a folder named by a digest of the job id: never in the
    ledger, never in events. Without a seed (tests) a key is random and lives only on disk.
    The executor `forget`s a job's key when the job has ended and its TPU is released.
    """

    def __init__(self, root: Path, seed_key: Path | None = None) -> None:
        self.root = Path(root)
        self.seed_key = Path(seed_key) if seed_key else None

    def path(self, job_id: str) -> Path:
        digest = hashlib.sha256(job_id.encode()).hexdigest()[:24]
        return self.root / digest / "id_ecdsa"

    def public(self, job_id: str) -> str:
        """The job's public key line, the key made (or derived) first if there is none yet."""
        path = self.path(job_id)
        if not path.exists() and self.seed_key is not None:
            _write_key(path, derive_job_key(self.seed_key.read_bytes(), job_id))
        return ensure_key(path)

    def existing(self, job_id: str) -> Path | None:
        """The job's private key when it has one here or can be derived, else None."""
        path = self.path(job_id)
        if not path.is_file() and self.seed_key is not None and self.seed_key.is_file():
            self.public(job_id)
        return path if path.is_file() else None

    def forget(self, job_id: str) -> bool:
        """Delete the job's cached key once its TPU is gone for good: the key opens nothing
        any more, and a derived key can be derived again if a host of the job is ever
        reached (`ledger doctor` on an ended job). True when there was a key to delete."""
        path = self.path(job_id)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        with contextlib.suppress(OSError):  # something else lives there (a peer wrote it again): keep it
            path.parent.rmdir()
        return True
