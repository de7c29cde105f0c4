"""GitHub's web-flow OpenPGP keys: the merges GitHub makes are signed with them.

`keys/web-flow.gpg` is the key file GitHub publishes (https://github.com/web-flow.gpg), as
package data. It holds two keys; only the current one is trusted by default:

    968479A1AFF927E37D1A566BB5690EEEBB952194  GitHub <noreply@github.com>, since 2024-01-16
    5DE3E0509C47EA3CF04A42D34AEE18F83AFDEB23  GitHub (web-flow commit signing), expired 2024-01-16

A lab can replace the set (GitHub Enterprise Server signs with its own key, and GitHub may
rotate again): LEDGER_WEB_FLOW_KEYS names an armored key file, and every key in it is trusted.

Verification is gpg's, through `git verify-commit` with a keyring holding these keys only
(`WebFlowKeys.home`); `verdict` reads gpg's machine-readable status lines (pure).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

from ledger.errors import UsageError

SHIPPED_FILE = "keys/web-flow.gpg"
# The keys of SHIPPED_FILE that count: fingerprint -> who it is.
SHIPPED_TRUSTED = {"968479A1AFF927E37D1A566BB5690EEEBB952194": "GitHub <noreply@github.com>"}
WEB_FLOW_PRINCIPAL = "GitHub web-flow"

Status = Literal["good", "none", "untrusted", "bad"]


@dataclass(frozen=True)
class Verdict:
    status: Status
    fingerprint: str = ""
    detail: str = ""


def verdict(status_lines: str, trusted: frozenset[str]) -> Verdict:
    """gpg's `--status-fd` output for one signature -> what it means for approval. Good
    only with GOODSIG and a VALIDSIG whose primary key is trusted."""
    fields: dict[str, list[str]] = {}
    for line in status_lines.splitlines():
        if line.startswith("[GNUPG:] "):
            word, *rest = line[9:].split()
            fields.setdefault(word, rest)
    valid = fields.get("VALIDSIG", [])
    primary = (valid[9] if len(valid) > 9 else valid[0] if valid else "").upper()
    if "BADSIG" in fields:
        return Verdict("bad", primary, "the OpenPGP signature does not verify")
    if "NO_PUBKEY" in fields or "ERRSIG" in fields:
        key = (fields.get("NO_PUBKEY") or fields.get("ERRSIG") or ["?"])[0]
        return Verdict("untrusted", key, f"signed by OpenPGP key {key}, which is not a trusted web-flow key")
    if "EXPKEYSIG" in fields or "REVKEYSIG" in fields:
        return Verdict("untrusted", primary, f"signed by web-flow key {primary}, which has expired or was revoked")
    if "GOODSIG" in fields and primary:
        if primary in trusted:
            return Verdict("good", primary)
        return Verdict("untrusted", primary, f"signed by OpenPGP key {primary}, which is not a trusted web-flow key")
    return Verdict("none")


@dataclass
class WebFlowKeys:
    """The armored keys to verify with and the fingerprints that count."""

    armored: bytes
    trusted: frozenset[str]
    _home: tempfile.TemporaryDirectory | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def shipped(cls) -> WebFlowKeys:
        data = resources.files("ledger.forge").joinpath(SHIPPED_FILE).read_bytes()
        return cls(data, frozenset(SHIPPED_TRUSTED))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> WebFlowKeys:
        """Every key of an armored file, trusted (the admin chose the file)."""
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read the web-flow keys {path}: {exc.strerror}",
                             hint="set LEDGER_WEB_FLOW_KEYS to an armored OpenPGP public key file") from exc
        keys = cls(data, frozenset())
        keys.trusted = frozenset(keys.fingerprints())
        if not keys.trusted:
            raise UsageError(f"{path} holds no OpenPGP public key", hint="export one with `gpg --armor --export KEYID`")
        return keys

    @classmethod
    def configured(cls) -> WebFlowKeys:
        """LEDGER_WEB_FLOW_KEYS when set, else the keys tpu-ledger ships."""
        path = os.environ.get("LEDGER_WEB_FLOW_KEYS")
        return cls.from_file(path) if path else cls.shipped()

    def home(self) -> Path:
        """A GNUPGHOME holding these keys only, made once (for this process's life)."""
        with self._lock:
            if self._home is None:
                home = tempfile.TemporaryDirectory(prefix="tpu-ledger-gnupg.")
                os.chmod(home.name, 0o700)
                _gpg(Path(home.name), "--import", input=self.armored)
                self._home = home
            return Path(self._home.name)

    def fingerprints(self) -> list[str]:
        """The primary keys' fingerprints in the file, as gpg reads them."""
        with tempfile.TemporaryDirectory(prefix="tpu-ledger-gnupg.") as tmp:
            out = _gpg(Path(tmp), "--with-colons", "--import-options", "show-only", "--import", input=self.armored)
        found, primary = [], False
        for line in out.splitlines():
            kind = line.split(":", 1)[0]
            if kind == "pub":
                primary = True
            elif kind == "fpr" and primary:
                found.append(line.split(":")[9].upper())
                primary = False
            elif kind == "sub":
                primary = False
        return found


def _gpg(home: Path, *args: str, input: bytes | None = None) -> str:
    try:
        proc = subprocess.run(["gpg", "--batch", "--no-tty", "--quiet", *args], input=input, capture_output=True,
                              env={**os.environ, "GNUPGHOME": str(home)}, timeout=60)
    except FileNotFoundError as exc:
        raise UsageError("gpg is not installed: it verifies GitHub's web-flow signatures",
                         hint="install gnupg (apt-get install gpg)") from exc
    if proc.returncode != 0:
        raise UsageError(f"gpg could not read the web-flow keys: {proc.stderr.decode(errors='replace').strip()[-200:]}",
                         hint="check LEDGER_WEB_FLOW_KEYS")
    return proc.stdout.decode(errors="replace")
