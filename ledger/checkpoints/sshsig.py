"""OpenSSH signatures (`ssh-keygen -Y sign` / `-Y verify`), written and checked in Python.

The format is OpenSSH's PROTOCOL.sshsig, the one git uses for SSH-signed commits: the signer
signs a blob that starts with the magic "SSHSIG", names a *namespace* and holds a hash of
the message; the signature file carries the public key, so a verifier only needs to know
which keys it trusts (an allowed-signers file, `ledger.checkpoints.signers`). The namespace
separates uses of one key: a checkpoint signature can never pass as an SSH login signature
or a git commit signature, which is why the reconciler's SSH key may sign checkpoints.

Written here rather than by running `ssh-keygen`, so the installed wheel signs and verifies
on hosts without OpenSSH; the tests check both directions against the real `ssh-keygen`.
Supported keys: ECDSA (nistp256/384/521, what the reconciler makes), Ed25519, RSA.

The encoding functions are pure; `SigningKey.load` reads a key file (the one I/O here).
The `cryptography` package (paramiko's own dependency) is imported where it is used: it is
not needed by `ledger --help` or by commands that never sign.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.errors import LedgerError

MAGIC = b"SSHSIG"
VERSION = 1
HASH_ALGORITHM = "sha512"  # what ssh-keygen uses by default
ARMOR_BEGIN = "-----BEGIN SSH SIGNATURE-----"
ARMOR_END = "-----END SSH SIGNATURE-----"
_CURVES = {"nistp256": "sha256", "nistp384": "sha384", "nistp521": "sha512"}  # RFC 5656 hash per curve


class SignatureError(ValueError):
    """A signature that cannot be read (truncated, not SSHSIG, an unknown key type)."""


class KeyProblem(LedgerError):
    """The signing key cannot be used: missing, encrypted, or of an unsupported type."""


# -- the wire format (RFC 4251 strings, mpints) ----------------------------------------------
def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _mpint(value: int) -> bytes:
    if value == 0:
        return _string(b"")
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return _string(b"\0" + raw if raw[0] & 0x80 else raw)  # a leading 0 keeps it positive


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def raw(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise SignatureError("the signature is truncated")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def uint32(self) -> int:
        return struct.unpack(">I", self.raw(4))[0]

    def string(self) -> bytes:
        return self.raw(self.uint32())

    def text(self) -> str:
        try:
            return self.string().decode("ascii")
        except UnicodeDecodeError as exc:
            raise SignatureError("a name in the signature is not ASCII") from exc

    def mpint(self) -> int:
        return int.from_bytes(self.string(), "big")

    def done(self) -> None:
        if self.at != len(self.data):
            raise SignatureError("trailing bytes after the signature")


def key_type(public_blob: bytes) -> str:
    """The key type named at the start of an SSH public key blob."""
    return _Reader(public_blob).text()


def fingerprint(public_blob: bytes) -> str:
    """OpenSSH's fingerprint, `SHA256:` and unpadded base64, as `ssh-keygen -l` prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(public_blob).digest()).decode().rstrip("=")


def public_line(public_blob: bytes) -> str:
    """`type base64`: the key as an authorized_keys or allowed_signers line writes it."""
    return f"{key_type(public_blob)} {base64.b64encode(public_blob).decode()}"


def signed_data(namespace: str, message: bytes, hash_algorithm: str = HASH_ALGORITHM) -> bytes:
    """What the key actually signs: the magic, the namespace and the message's hash."""
    digest = hashlib.new(hash_algorithm, message).digest()
    return MAGIC + _string(namespace.encode()) + _string(b"") + _string(hash_algorithm.encode()) + _string(digest)


@dataclass(frozen=True, slots=True)
class Signature:
    public_key: bytes  # the signer's public key blob
    namespace: str
    hash_algorithm: str
    signature_type: str  # "ecdsa-sha2-nistp256", "ssh-ed25519", "rsa-sha2-512", ...
    signature: bytes  # the algorithm's own bytes (for ECDSA: mpint r, mpint s)

    @property
    def key_fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def encode(self) -> bytes:
        return (MAGIC + struct.pack(">I", VERSION) + _string(self.public_key) + _string(self.namespace.encode())
                + _string(b"") + _string(self.hash_algorithm.encode())
                + _string(_string(self.signature_type.encode()) + _string(self.signature)))

    def armor(self) -> str:
        text = base64.b64encode(self.encode()).decode()
        lines = [text[i:i + 70] for i in range(0, len(text), 70)]  # ssh-keygen's line length
        return "\n".join([ARMOR_BEGIN, *lines, ARMOR_END]) + "\n"

    @classmethod
    def decode(cls, blob: bytes) -> Signature:
        r = _Reader(blob)
        if r.raw(6) != MAGIC:
            raise SignatureError("not an SSH signature (no SSHSIG magic)")
        if (version := r.uint32()) != VERSION:
            raise SignatureError(f"SSH signature version {version} is not supported")
        public_key, namespace = r.string(), r.text()
        r.string()  # reserved
        hash_algorithm = r.text()
        inner = _Reader(r.string())
        r.done()
        signature_type, signature = inner.text(), inner.string()
        inner.done()
        return cls(public_key, namespace, hash_algorithm, signature_type, signature)

    @classmethod
    def from_armor(cls, text: str) -> Signature:
        lines = [line.strip() for line in text.strip().splitlines()]
        if len(lines) < 3 or lines[0] != ARMOR_BEGIN or lines[-1] != ARMOR_END:
            raise SignatureError(f"not an armored SSH signature ({ARMOR_BEGIN} ... {ARMOR_END})")
        try:
            blob = base64.b64decode("".join(lines[1:-1]), validate=True)
        except ValueError as exc:
            raise SignatureError("the signature's base64 is damaged") from exc
        return cls.decode(blob)

    def verify(self, message: bytes, namespace: str) -> str | None:
        """None when the signature is the key's over `message` in `namespace`; else why not."""
        if self.namespace != namespace:
            return f"signed for namespace {self.namespace!r}, not {namespace!r}"
        if self.hash_algorithm not in ("sha256", "sha512"):
            return f"hash algorithm {self.hash_algorithm!r} is not one ssh-keygen accepts"
        try:
            ok = _verify(self, signed_data(namespace, message, self.hash_algorithm))
        except SignatureError as exc:
            return str(exc)
        return None if ok else "the signature does not match the signed text: forged or altered"


# -- keys ------------------------------------------------------------------------------------
def _public_blob(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    line = public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return base64.b64decode(line.split()[1])


def _load_public(blob: bytes) -> Any:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    try:
        return serialization.load_ssh_public_key(public_line(blob).encode())
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise SignatureError(f"the signature's public key cannot be read: {exc}") from exc


def _verify(sig: Signature, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    kind = key_type(sig.public_key)
    key = _load_public(sig.public_key)
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            if sig.signature_type != kind:
                raise SignatureError(f"a {sig.signature_type} signature from a {kind} key")
            inner = _Reader(sig.signature)
            r, s = inner.mpint(), inner.mpint()
            inner.done()
            digest = getattr(hashes, _CURVES[kind.rsplit("-", 1)[1]].upper())()
            key.verify(encode_dss_signature(r, s), data, ec.ECDSA(digest))
        elif isinstance(key, ed25519.Ed25519PublicKey):
            if sig.signature_type != "ssh-ed25519":
                raise SignatureError(f"a {sig.signature_type} signature from an Ed25519 key")
            key.verify(sig.signature, data)
        elif isinstance(key, rsa.RSAPublicKey):
            digest = {"rsa-sha2-256": hashes.SHA256, "rsa-sha2-512": hashes.SHA512}.get(sig.signature_type)
            if digest is None:  # ssh-rsa (SHA-1) is refused by OpenSSH for signatures too
                raise SignatureError(f"RSA signature type {sig.signature_type!r} is not accepted")
            key.verify(sig.signature, data, padding.PKCS1v15(), digest())
        else:
            raise SignatureError(f"key type {kind} is not supported")
    except InvalidSignature:
        return False
    return True


class SigningKey:
    """A private key that signs in SSHSIG format. It never leaves this object: only the
    public half and signatures come out."""

    def __init__(self, private_key: Any, source: str = "") -> None:
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

        if not isinstance(private_key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey):
            raise KeyProblem(f"{source or 'the key'} is a {type(private_key).__name__}; "
                            "checkpoints are signed with ECDSA, Ed25519 or RSA keys")
        self._key = private_key
        self.public_key = _public_blob(private_key.public_key())
        self.source = source

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        """An unencrypted private key file: OpenSSH format (ssh-keygen) or PEM (paramiko)."""
        from cryptography.hazmat.primitives import serialization

        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise KeyProblem(f"cannot read the signing key {path}: {exc.strerror}",
                            hint="set LEDGER_SSH_KEY (or --ssh-key) to the reconciler's private key") from exc
        try:
            if b"OPENSSH PRIVATE KEY" in data:
                key = serialization.load_ssh_private_key(data, password=None)
            else:
                key = serialization.load_pem_private_key(data, password=None)
        except TypeError as exc:  # cryptography's way of saying "it needs a passphrase"
            raise KeyProblem(f"the signing key {path} is encrypted",
                            hint="a service signs unattended: use a key without a passphrase, readable only by it") from exc
        except ValueError as exc:
            raise KeyProblem(f"{path} is not a private key tpu-ledger can read") from exc
        return cls(key, str(path))

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def sign(self, message: bytes, namespace: str) -> Signature:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        data = signed_data(namespace, message)
        kind = key_type(self.public_key)
        key = self._key
        if isinstance(key, ec.EllipticCurvePrivateKey):
            digest = getattr(hashes, _CURVES[kind.rsplit("-", 1)[1]].upper())()
            r, s = decode_dss_signature(key.sign(data, ec.ECDSA(digest)))
            sig_type, raw = kind, _mpint(r) + _mpint(s)
        elif isinstance(key, ed25519.Ed25519PrivateKey):
            sig_type, raw = "ssh-ed25519", key.sign(data)
        else:
            sig_type, raw = "rsa-sha2-512", key.sign(data, padding.PKCS1v15(), hashes.SHA512())
        return Signature(self.public_key, namespace, HASH_ALGORITHM, sig_type, raw)

    def __repr__(self) -> str:  # never the private half, even in a traceback or a log
        return f"SigningKey({self.fingerprint}, {self.source or 'in memory'})"
