"""OpenSSH signatures written in Python: they verify with the real `ssh-keygen -Y verify`, ours
verify `ssh-keygen -Y sign`'s, and any change to the text, the namespace or the key fails."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from ledger.checkpoints import NAMESPACE, SigningKey, signers
from ledger.checkpoints.sshsig import KeyProblem, Signature, SignatureError, public_line

MESSAGE = b"tpu-ledger checkpoint v1\nseq 3\n"


def _write(path: Path, key) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return path


@pytest.fixture(params=["reconciler", "ecdsa-p384", "ed25519", "rsa"])
def key_file(request, tmp_path: Path, signing_key: Path) -> Path:
    """The reconciler's own key (paramiko, PEM) and the other types ssh-keygen makes."""
    made = {"ecdsa-p384": lambda: ec.generate_private_key(ec.SECP384R1()),
            "ed25519": ed25519.Ed25519PrivateKey.generate,
            "rsa": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)}
    if request.param == "reconciler":
        return signing_key
    return _write(tmp_path / request.param, made[request.param]())


def test_a_signature_verifies_and_any_change_fails(key_file: Path):
    key = SigningKey.load(key_file)
    armored = key.sign(MESSAGE, NAMESPACE).armor()
    sig = Signature.from_armor(armored)
    assert sig.verify(MESSAGE, NAMESPACE) is None
    assert sig.key_fingerprint == key.fingerprint and sig.public_key == key.public_key
    assert "forged or altered" in sig.verify(MESSAGE.replace(b"3", b"4"), NAMESPACE)
    assert "namespace" in sig.verify(MESSAGE, "git")
    # Another key's public half in the blob: the signature no longer matches it.
    other = SigningKey(ec.generate_private_key(ec.SECP256R1()))
    swapped = Signature(other.public_key, sig.namespace, sig.hash_algorithm, other.sign(b"x", NAMESPACE).signature_type,
                        sig.signature)
    assert swapped.verify(MESSAGE, NAMESPACE) is not None


def test_ssh_keygen_verifies_ours_and_we_verify_ssh_keygens(key_file: Path, tmp_path: Path):
    key = SigningKey.load(key_file)
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"recon-a {public_line(key.public_key)}\n")
    ours = tmp_path / "ours.sig"
    ours.write_text(key.sign(MESSAGE, NAMESPACE).armor())
    checked = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", "recon-a", "-n", NAMESPACE,
                              "-s", str(ours)], input=MESSAGE, capture_output=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    assert b'Good "tpu-ledger-checkpoint" signature for recon-a' in checked.stdout

    # ssh-keygen needs the public half beside a PEM key (paramiko writes none).
    Path(f"{key_file}.pub").write_text(public_line(key.public_key) + "\n")
    message = tmp_path / "message"
    message.write_bytes(MESSAGE)
    subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(key_file), "-n", NAMESPACE, str(message)],
                   check=True, capture_output=True, timeout=30)
    theirs = Signature.from_armor(Path(f"{message}.sig").read_text())
    assert theirs.verify(MESSAGE, NAMESPACE) is None
    assert theirs.verify(MESSAGE + b"\n", NAMESPACE) is not None


def test_damaged_armor_and_blobs_are_refused_in_words():
    with pytest.raises(SignatureError, match="not an armored SSH signature"):
        Signature.from_armor("hello")
    with pytest.raises(SignatureError, match="base64"):
        Signature.from_armor("-----BEGIN SSH SIGNATURE-----\n!!!\n-----END SSH SIGNATURE-----\n")
    with pytest.raises(SignatureError, match="SSHSIG magic"):
        Signature.decode(b"NOTSIG" + bytes(20))
    with pytest.raises(SignatureError, match="truncated"):
        Signature.decode(b"SSHSIG\0\0\0\1\0\0\1\0")


def test_keys_that_cannot_sign_unattended_are_refused(tmp_path: Path):
    encrypted = tmp_path / "encrypted"
    encrypted.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(KeyProblem, match="encrypted"):
        SigningKey.load(encrypted)
    with pytest.raises(KeyProblem, match="cannot read"):
        SigningKey.load(tmp_path / "missing")
    (tmp_path / "junk").write_text("not a key\n")
    with pytest.raises(KeyProblem, match="not a private key"):
        SigningKey.load(tmp_path / "junk")


def test_the_private_half_never_shows_in_its_repr(signing_key: Path):
    key = SigningKey.load(signing_key)
    secret = signing_key.read_text().splitlines()[1]
    assert secret not in repr(key) and key.fingerprint in repr(key)


# -- allowed signers ---------------------------------------------------------------------
def test_allowed_signers_follow_openssh_rules(signing_key: Path):
    key = SigningKey.load(signing_key).public_key
    other = SigningKey(ed25519.Ed25519PrivateKey.generate()).public_key
    text = (
        "# comment\n\n"
        f"recon-*,!recon-evil {public_line(key)} the reconcilers\n"
        f'ops@lab.org namespaces="file,{NAMESPACE}",valid-before="20300101Z" {public_line(other)}\n'
    )
    allowed = signers.parse(text, "allowed_signers")
    assert allowed.check("recon-a", key, NAMESPACE, 0) is None
    assert "not allowed to sign as 'recon-evil'" in allowed.check("recon-evil", key, NAMESPACE, 0)
    assert "not allowed to sign as 'ops@lab.org'" in allowed.check("ops@lab.org", key, NAMESPACE, 0)
    assert allowed.check("ops@lab.org", other, NAMESPACE, 1.8e9) is None
    assert "valid-before" in allowed.check("ops@lab.org", other, NAMESPACE, 1.95e9)
    assert "namespaces" in allowed.check("ops@lab.org", other, "email", 1.8e9)
    stranger = SigningKey(ec.generate_private_key(ec.SECP256R1())).public_key
    assert "is not in allowed_signers" in allowed.check("recon-a", stranger, NAMESPACE, 0)


ED25519 = public_line(SigningKey(ed25519.Ed25519PrivateKey.generate()).public_key)


@pytest.mark.parametrize("line, why", [
    ("recon-a", "expected `principals"),
    ("recon-a ecdsa-sha2-nistp256 !!!!", "the key's base64 is damaged"),
    ("recon-a ssh-ed25519 AAAA", "the key is damaged"),
    (f'recon-a color="red" {ED25519}', "unknown option 'color'"),
    (f'recon-a namespaces="x {ED25519}', "an unterminated quote"),
    (f'recon-a valid-after="tomorrow" {ED25519}', "bad time 'tomorrow'"),
    ("recon-a cert-authority AAAA", "expected a key type"),
], ids=lambda v: v.replace(ED25519, "KEY"))  # the key is random: ids stay stable across runs
def test_a_bad_allowed_signers_line_is_named_by_number(line: str, why: str):
    with pytest.raises(signers.SignersError, match=rf"^allowed_signers:3: {why}"):
        signers.parse(f"# a\n\n{line}\n", "allowed_signers")


def test_a_key_of_another_type_than_its_line_says_is_refused(signing_key: Path):
    blob = public_line(SigningKey.load(signing_key).public_key).split()[1]
    with pytest.raises(signers.SignersError, match="is a ecdsa-sha2-nistp256 key, not ssh-ed25519"):
        signers.parse(f"recon-a ssh-ed25519 {blob}\n")
