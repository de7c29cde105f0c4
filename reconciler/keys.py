"""The reconciler's SSH identity: a private key on the ledger host, its public half sent to
nodes in the `ssh-keys` metadata at creation, as Google Cloud's guest agent expects."""

from __future__ import annotations

import os
from pathlib import Path


def ensure_key(path: Path) -> str:
    """Create an ECDSA key at `path` if missing (paramiko cannot make Ed25519); return the
    public key line `type base64 comment`."""
    import paramiko

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
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
