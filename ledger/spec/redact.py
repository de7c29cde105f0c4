"""Redaction: the values of the secrets a job received, masked out of what is collected.

A job's command can print what it was given (`cat ~/.ssh/*`). The reconciler fetches that
output into LEDGER_LOG_DIR, where `ledger logs`, the dashboard and the failure patterns
(whose matches are recorded in the ledger) read it; so the output is redacted as it is
collected. Masks keep the length (`[redacted****]`), so a collected log's size still equals
the bytes fetched from the host, which is how the next fetch knows where to start.

What is a secret: every file an `ssh` field names (keys), and any file named with the
`secret://` scheme; a plain relative name (`envs/train.yml`) is a file, not a secret.
Each line of a secret of REDACT_MIN_CHARS or more is masked wherever it appears, so the
secret is caught whole, line by line, or inside a longer line. A transformed copy (base64,
reversed, split mid-line) is not recognised: what a job's own command does with its
secrets is the job's business (docs/security.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ledger import defaults
from ledger.spec.secrets import SCHEME, file_fields

_PAD = b"*"


def secret_refs(spec: Mapping) -> list[str]:
    """The references of a normalised spec whose contents are secrets."""
    return [ref for pointer, ref in file_fields(dict(spec)) if isinstance(ref, str)
            and (pointer.startswith("/ssh/") or ref.startswith(SCHEME))]


def mask(text: bytes) -> bytes:
    """A mask of the same length as `text`."""
    n = len(text)
    return b"[redacted" + _PAD * (n - 10) + b"]" if n >= 10 else _PAD * n


class Redactor:
    """Masks every occurrence of the given secret values; `Redactor(())` changes nothing."""

    def __init__(self, values: Iterable[bytes]) -> None:
        needles: set[bytes] = set()
        for value in values:
            lines = [ln.strip() for ln in value.splitlines()]
            needles.update(ln for ln in lines if len(ln) >= defaults.REDACT_MIN_CHARS)
            whole = value.strip()
            if whole and b"\n" not in whole:
                needles.add(whole)  # a short one-line secret (a token) is still a secret
        # longest first, so a line is masked whole rather than around a shorter needle in it
        ordered = sorted(needles, key=len, reverse=True)
        self._pattern = re.compile(b"|".join(re.escape(n) for n in ordered)) if ordered else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def __call__(self, data: bytes) -> bytes:
        if self._pattern is None or not data:
            return data
        return self._pattern.sub(lambda m: mask(m.group()), data)

    def text(self, text: str) -> str:
        return self(text.encode()).decode(errors="replace") if self else text


def complete(data: bytes) -> int:
    """How much of freshly fetched output ends a line (\\n or \\r): a secret split across
    two fetches is redacted once its line is whole."""
    return max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
