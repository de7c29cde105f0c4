"""Files a job spec names (SSH identities, conda and requirements files): where they may come from.

A spec is written by any lab member, and the reconciler copies what it names to the job's
hosts, where the job's command can read it. So a spec never names a file on the
reconciler's host. It names a file in its owner's secrets folder, which an admin fills:

    $LEDGER_SECRETS_DIR/<owner>/<name>          (default ~/.local/share/tpu-ledger/secrets)

either as `secret://<name>` (Secret Manager style) or as a plain relative name
(`id_deploy`, `envs/train.yml`). Absolute paths, `~`, `..` and anything that resolves
outside the owner's folder (a symbolic link, another owner's folder, the reconciler's own
key) are refused: by `ledger validate` and the watcher (a `rejected` event with the field's
line), and again by the reconciler when it reads the file (`read_secret`), which resolves
the real path and checks that it is still inside the owner's folder.

`reference_problem` is pure (the text only); `SecretsDir` looks at the disk.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEME = "secret://"
_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
MAX_REF = 255
MAX_SECRET_BYTES = 1 << 20  # a key or an environment file, never a data set
WHERE = "your secrets folder (LEDGER_SECRETS_DIR/<owner>/)"


class SecretError(Exception):
    """A reference that must not be read; the message says why and what to do."""


def file_fields(spec: dict) -> Iterator[tuple[str, Any]]:
    """(pointer, value) of every field of a normalised spec that names a file to read."""
    ssh = spec.get("ssh") or {}
    for key in ("private_key", "public_key"):
        if ssh.get(key) is not None:
            yield f"/ssh/{key}", ssh[key]
    for i, ident in enumerate(ssh.get("identities") or []):
        for key in ("private_key", "public_key"):
            if isinstance(ident, dict) and ident.get(key) is not None:
                yield f"/ssh/identities/{i}/{key}", ident[key]
    conda = spec.get("conda") or {}
    if conda.get("config_file") is not None:
        yield "/conda/config_file", conda["config_file"]
    venv = spec.get("venv") or {}
    if venv.get("requirements_file") is not None:
        yield "/venv/requirements_file", venv["requirements_file"]


def name_of(ref: str) -> str:
    """The file's name inside the owner's folder: `secret://x` -> `x`, `a/b` -> `a/b`."""
    return ref[len(SCHEME):] if ref.startswith(SCHEME) else ref


def reference_problem(ref: Any, reconciler_key: str | None = None) -> tuple[str, str] | None:
    """(problem, hint) when `ref` may not name a secret, else None. Text only, no disk."""
    if not isinstance(ref, str) or not ref:
        return "a file reference must be a non-empty string", f"name a file in {WHERE}, e.g. secret://id_deploy"
    if len(ref) > MAX_REF:
        return f"the file reference is longer than {MAX_REF} characters", "use a shorter name"
    if not ref.isprintable():
        return "the file reference has control characters", "use letters, digits, dots, dashes and underscores"
    name = name_of(ref)
    if "://" in name or (":" in ref.split("/", 1)[0] and not ref.startswith(SCHEME)):
        return f"{ref!r} is not a reference the ledger resolves", f"use secret://<name> for a file in {WHERE}"
    if reconciler_key and os.path.normpath(os.path.expanduser(ref)) == os.path.normpath(reconciler_key):
        return ("this is the reconciler's own SSH key: it opens every job's hosts and never leaves the reconciler",
                f"give the job a key of its own, in {WHERE}")
    if ref.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:[\\/]", ref):
        return (f"absolute path {ref!r}: files are never read from the reconciler's host",
                f"put the file in {WHERE} and write its name, e.g. secret://{os.path.basename(ref) or 'id_deploy'}")
    if ref.startswith("~"):
        return (f"{ref!r} names a home folder on the reconciler's host",
                f"put the file in {WHERE} and write its name, e.g. secret://{os.path.basename(ref) or 'id_deploy'}")
    parts = name.split("/")
    if ".." in parts:
        return f"{ref!r} uses `..` to leave {WHERE}", "name a file inside your own secrets folder"
    for part in parts:
        if not _PART.match(part):
            return (f"{ref!r} is not a plain file name (part {part!r})",
                    "use letters, digits, dots, dashes and underscores, folders separated by /")
    return None


@dataclass(frozen=True)
class SecretsDir:
    """The admin's secrets folder on this host: `<root>/<owner>/<name>`."""

    root: Path
    reconciler_key: Path | None = None  # never handed out, whatever links or copies lead to it

    def owner_dir(self, owner: str) -> Path:
        if not owner or not _PART.match(owner):
            raise SecretError(f"no secrets folder for owner {owner!r}")
        return self.root / owner

    def resolve(self, owner: str, ref: str) -> Path:
        """The real path of `ref` in `owner`'s folder; SecretError when it is not there or
        leads anywhere else (checked after every symbolic link is followed)."""
        key = str(self.reconciler_key) if self.reconciler_key else None
        problem = reference_problem(ref, key)
        if problem is not None:
            raise SecretError(f"{problem[0]} ({problem[1]})")
        base = os.path.realpath(self.owner_dir(owner))
        target = os.path.realpath(os.path.join(base, name_of(ref)))
        if os.path.commonpath([base, target]) != base or target == base:
            raise SecretError(f"{ref!r} leads outside {owner}'s secrets folder (a symbolic link?); only files inside it are read")
        if key and os.path.exists(key) and target == os.path.realpath(key):
            raise SecretError(f"{ref!r} leads to the reconciler's own SSH key, which never leaves the reconciler")
        return Path(target)

    def problem(self, owner: str, ref: str) -> tuple[str, str] | None:
        """What `ledger validate` and the watcher report for `ref` on this host: (severity,
        message) for an escape (error) or a missing file (warning), else None."""
        try:
            path = self.resolve(owner, ref)
        except SecretError as exc:
            return "error", str(exc)
        if not path.is_file():
            return "warning", f"{ref!r} is not in {owner}'s secrets folder on this host ({self.root / owner})"
        return None

    def read(self, owner: str, ref: str) -> bytes:
        """The file's bytes, resolved and checked again at the moment of reading: the last
        component is opened without following links, and a copy of the reconciler's key
        is refused by content."""
        path = self.resolve(owner, ref)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            raise SecretError(f"cannot read {ref!r} from {owner}'s secrets folder: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise SecretError(f"{ref!r} in {owner}'s secrets folder is not a regular file")
            data = fh.read(MAX_SECRET_BYTES + 1)
        if len(data) > MAX_SECRET_BYTES:
            raise SecretError(f"{ref!r} is over {MAX_SECRET_BYTES // 1024} KiB; secrets are keys and small files")
        if self.reconciler_key and self.reconciler_key.is_file() and data.strip() == self.reconciler_key.read_bytes().strip():
            raise SecretError(f"{ref!r} is a copy of the reconciler's own SSH key, which never leaves the reconciler")
        return data
