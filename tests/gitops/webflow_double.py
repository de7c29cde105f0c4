"""A web-flow double: an OpenPGP key pair made for the test (gpg), and merges signed with it
as GitHub signs the merges it makes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gitops_helpers import git_env


class WebFlowDouble:
    def __init__(self, root: Path, uid: str = "GitHub Double <noreply@github.example>") -> None:
        self.home = root / "gnupg"
        self.home.mkdir(mode=0o700)
        self.gpg("--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
        out = self.gpg("--with-colons", "--list-keys")
        self.fingerprint = next(line.split(":")[9] for line in out.splitlines() if line.startswith("fpr"))
        self.public = root / "web-flow.asc"
        self.public.write_text(self.gpg("--armor", "--export", self.fingerprint))

    def gpg(self, *args: str) -> str:
        proc = subprocess.run(["gpg", "--batch", "--pinentry-mode", "loopback", *args], capture_output=True,
                              env={**os.environ, "GNUPGHOME": str(self.home)}, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def git(self, cwd: Path, *args: str, author: tuple[str, str]) -> str:
        """git as GitHub runs it: GitHub commits, the author is who pressed the button."""
        env = {**git_env(author, committer=("GitHub", "noreply@github.com")), "GNUPGHOME": str(self.home)}
        proc = subprocess.run(["git", "-C", str(cwd), "-c", "gpg.program=gpg", "-c", f"user.signingkey={self.fingerprint}",
                               *args], capture_output=True, env=env, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def close(self) -> None:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env={**os.environ, "GNUPGHOME": str(self.home)},
                       capture_output=True, timeout=30)
