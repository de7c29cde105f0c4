"""A job's `args` (config overrides): aliases expanded to full config names, and the flags
the runner appends to the command. One implementation for the job's `args:` and for each
placement choice's own (`tpu.fallbacks[i].args`, ledger.spec.placement)."""

from __future__ import annotations

from typing import Any, Protocol

from ledger.spec.config import RepoConfig
from ledger.spec.schema import close_match
from ledger.spec.yamlsafe import escape


class Reporter(Protocol):
    """Where findings go (normalize's report): an error or a warning at a JSON pointer."""

    def error(self, pointer: str, message: str, hint: str = "", *, at_key: bool = False) -> None: ...
    def warn(self, pointer: str, message: str, hint: str = "", *, at_key: bool = False) -> None: ...


def expand(args: dict, config: RepoConfig, report: Reporter, base: str = "/args") -> dict[str, Any]:
    """`args` keyed by full config names (aliases from .ledger/aliases.yaml expanded); an
    unknown alias or two keys naming one config are reported at `base`/key."""
    table: dict = (config.aliases or {}).get("config") or {}
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in args.items():
        if "." in key:
            full = key
        elif key in table:
            full = table[key]
        else:
            guess = close_match(key, sorted(table))
            hint = f"did you mean `{guess}`?" if guess else "write the full config name (e.g. config.training.learning_rate)"
            report.error(f"{base}/{escape(key)}", f"`{key}` is not a config alias", f"{hint} Or add the alias to .ledger/aliases.yaml under `config:`.", at_key=True)
            continue
        if full in out:
            report.error(f"{base}/{escape(key)}", f"`{key}` and `{origin[full]}` both set {full}", "keep one of them", at_key=True)
            continue
        out[full] = value
        origin[full] = key
    return out


def flags(full: dict[str, Any]) -> list[str]:
    """Expanded `args` as command-line flags, e.g. ["--config.training.learning_rate=0.01"].

    Values use Python literal spelling (True, False, None), which ml_collections and absl
    config flags parse; the SSH runner quotes each item."""
    return [f"--{key}={repr(value) if isinstance(value, bool) or value is None else value}" for key, value in full.items()]
