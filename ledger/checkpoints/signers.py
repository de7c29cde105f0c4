"""Who may sign checkpoints: an OpenSSH allowed-signers file (ssh-keygen(1), ALLOWED SIGNERS).

One line per trusted key: `principals [options] keytype base64-key [comment]`, where
principals is a comma-separated pattern list (`*` and `?` wildcards, `!` negates) and the
options are `namespaces="a,b"`, `valid-after="YYYYMMDD[HHMM[SS]][Z]"`, `valid-before=...`
and `cert-authority`. The same file works with `ssh-keygen -Y verify -f FILE`, and git reads
it as `gpg.ssh.allowedSignersFile`. Validity is judged at the checkpoint's own time, so
retiring a key with `valid-before` keeps the checkpoints it signed before then valid.

Certificate authorities are not supported (the line is kept but never matches): checkpoints
are signed by plain keys. Pure: parsing and matching, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from ledger.checkpoints.sshsig import SignatureError, fingerprint, key_type, public_line


class SignersError(ValueError):
    """A line of an allowed-signers file that cannot be read: `where:line: what`."""


@dataclass(frozen=True, slots=True)
class AllowedSigner:
    principals: tuple[str, ...]  # patterns
    public_key: bytes
    namespaces: tuple[str, ...] | None = None  # None = any
    valid_after: float | None = None  # epoch seconds
    valid_before: float | None = None
    cert_authority: bool = False
    line: int = 0

    def matches_principal(self, principal: str) -> bool:
        """OpenSSH's pattern-list rule: a negated match refuses, else any match accepts."""
        hit = False
        for pattern in self.principals:
            negated = pattern.startswith("!")
            if fnmatch.fnmatchcase(principal, pattern[1:] if negated else pattern):
                if negated:
                    return False
                hit = True
        return hit

    def problem(self, namespace: str, at: float) -> str | None:
        """Why this key may not sign in `namespace` at time `at` (None: it may)."""
        if self.namespaces is not None and namespace not in self.namespaces:
            return f"allowed only for namespaces {','.join(self.namespaces)}"
        if self.valid_after is not None and at < self.valid_after:
            return "signed before the key's valid-after time"
        if self.valid_before is not None and at >= self.valid_before:
            return "signed after the key's valid-before time"
        return None


@dataclass(frozen=True, slots=True)
class AllowedSigners:
    signers: tuple[AllowedSigner, ...]
    where: str = "allowed signers"

    def check(self, principal: str, public_key: bytes, namespace: str, at: float) -> str | None:
        """None when `public_key` may sign as `principal`; else why not, in a few words."""
        keyed = [s for s in self.signers if s.public_key == public_key and not s.cert_authority]
        if not keyed:
            return f"its key {fingerprint(public_key)} is not in {self.where}"
        named = [s for s in keyed if s.matches_principal(principal)]
        if not named:
            return f"its key {fingerprint(public_key)} is not allowed to sign as {principal!r} in {self.where}"
        problems = [s.problem(namespace, at) for s in named]
        if None in problems:
            return None
        return f"its key {fingerprint(public_key)} is in {self.where} but {problems[0]}"

    def principals_of(self, public_key: bytes, namespace: str) -> tuple[str, ...]:
        """The names (not patterns) this file lets `public_key` sign as in `namespace`."""
        names = (p for s in self.signers if s.public_key == public_key and not s.cert_authority
                 and (s.namespaces is None or namespace in s.namespaces)
                 for p in s.principals if not p.startswith("!") and not any(c in p for c in "*?"))
        return tuple(dict.fromkeys(names))

    def line_for(self, principal: str, public_key: bytes, namespace: str) -> str:
        """The line an operator adds to trust this key, for this use only."""
        return f'{principal} namespaces="{namespace}" {public_line(public_key)}'


def _tokens(line: str) -> list[str]:
    """Whitespace-separated fields; double quotes keep spaces inside a field."""
    out: list[str] = []
    current, quoted, started = [], False, False
    for ch in line:
        if ch == '"':
            quoted, started = not quoted, True
            current.append(ch)
        elif ch.isspace() and not quoted:
            if started:
                out.append("".join(current))
                current, started = [], False
        else:
            current.append(ch)
            started = True
    if quoted:
        raise SignersError("an unterminated quote")
    if started:
        out.append("".join(current))
    return out


def _split_options(text: str) -> list[str]:
    parts, current, quoted = [], [], False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _timestamp(value: str) -> float:
    """ssh-keygen's YYYYMMDD, YYYYMMDDHHMM or YYYYMMDDHHMMSS, UTC with a Z, else local time."""
    utc = value.endswith(("Z", "z"))
    digits = value[:-1] if utc else value
    formats = {8: "%Y%m%d", 12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}
    if not digits.isdigit() or len(digits) not in formats:
        raise SignersError(f"bad time {value!r}: write YYYYMMDD, YYYYMMDDHHMM or YYYYMMDDHHMMSS, Z for UTC")
    moment = datetime.strptime(digits, formats[len(digits)])
    return moment.replace(tzinfo=UTC).timestamp() if utc else time.mktime(moment.timetuple())


def _is_key_type(token: str) -> bool:
    return token.startswith(("ssh-", "ecdsa-", "sk-", "rsa-"))


def parse(text: str, where: str = "allowed signers") -> AllowedSigners:
    """Every line of an allowed-signers file; SignersError naming `where:line` for a bad one."""
    signers = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            signers.append(_line(line, number))
        except SignersError as exc:
            raise SignersError(f"{where}:{number}: {exc}") from None
    return AllowedSigners(tuple(signers), where)


def _line(line: str, number: int) -> AllowedSigner:
    fields = _tokens(line)
    if len(fields) < 3:
        raise SignersError("expected `principals [options] keytype base64-key`")
    principals = tuple(p.strip('"') for p in fields[0].split(",") if p.strip('"'))
    rest = fields[1:]
    options: dict[str, str | None] = {}
    if not _is_key_type(rest[0]):
        for option in _split_options(rest[0]):
            name, eq, value = option.partition("=")
            options[name.lower()] = value.strip('"') if eq else None
        rest = rest[1:]
    unknown = set(options) - {"namespaces", "valid-after", "valid-before", "cert-authority"}
    if unknown:
        raise SignersError(f"unknown option {sorted(unknown)[0]!r}")
    namespaces = options.get("namespaces")
    after, before = options.get("valid-after"), options.get("valid-before")
    valid_after, valid_before = (_timestamp(after) if after else None), (_timestamp(before) if before else None)
    if len(rest) < 2 or not _is_key_type(rest[0]):
        raise SignersError("expected a key type (ecdsa-sha2-nistp256, ssh-ed25519, ...) and its base64 key")
    try:
        blob = base64.b64decode(rest[1], validate=True)
    except (binascii.Error, ValueError):
        raise SignersError("the key's base64 is damaged") from None
    try:
        kind = key_type(blob)
    except SignatureError:
        raise SignersError("the key is damaged") from None
    if kind != rest[0]:
        raise SignersError(f"the key is a {kind} key, not {rest[0]}")
    return AllowedSigner(
        principals=principals, public_key=blob,
        namespaces=tuple(n for n in namespaces.split(",") if n) if namespaces else None,
        valid_after=valid_after, valid_before=valid_before,
        cert_authority="cert-authority" in options, line=number,
    )
