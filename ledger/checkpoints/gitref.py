"""Checkpoints in a git ref of the jobs repository: a commit chain, one checkpoint per commit.

Each commit's tree holds two files, `checkpoint` (the signed text) and `checkpoint.sig` (the
armored OpenSSH signature); each commit's parent is the previous checkpoint. The history of
`refs/ledger/checkpoints` is therefore every checkpoint ever published, and publishing only
ever adds a commit on top (a plain push, never a forced one): a hub that refuses
non-fast-forward pushes keeps that history, and a publisher notices when the ref was moved
back under it.

The adapter works in a scratch bare repository and talks to the hub with `git fetch` and
`git push` (the git access the watcher already has); GitPython builds the objects in-process.
GitPython is imported where used: `ledger --help` does not pay for it.
"""

from __future__ import annotations

import io
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ledger.checkpoints.note import Signed
from ledger.errors import LedgerError, UsageError, safe_url

DEFAULT_REF = "refs/ledger/checkpoints"
BODY_FILE = "checkpoint"
SIGNATURE_FILE = "checkpoint.sig"
ALLOWED_SIGNERS_PATH = ".ledger/allowed_signers"  # on the hub's default branch, reviewed like policy
_TIP = "refs/tpu-ledger/tip"  # the scratch repository's copy of the hub's ref
_HUB_HEAD = "refs/tpu-ledger/hub-head"
_AUTHOR = ("tpu-ledger", "tpu-ledger@localhost")
PUSH_ATTEMPTS = 4

log = logging.getLogger("tpu_ledger.checkpoints")


class CheckpointRepoError(LedgerError):
    pass


def check_ref(ref: str) -> str:
    if not ref.startswith("refs/") or ref.endswith("/") or ".." in ref or any(c.isspace() for c in ref):
        raise UsageError(f"bad checkpoint ref {ref!r}",
                                  hint=f"a full ref name such as {DEFAULT_REF} or refs/heads/ledger-checkpoints")
    return ref


class CheckpointRepo:
    """The checkpoints at `url` under `ref`: read them, or add one."""

    def __init__(self, url: str, ref: str = DEFAULT_REF) -> None:
        self.url = url
        self.shown = safe_url(url)  # for messages and logs: never a password or token in a URL
        self.ref = check_ref(ref)
        self._dir: Path | None = None
        self._repo: Any = None
        self._last_pushed: str | None = None  # what this process published last (rollback check)

    # -- the scratch repository ---------------------------------------------------------
    def _scratch(self) -> Any:
        if self._repo is None:
            import git

            self._dir = Path(tempfile.mkdtemp(prefix="tpu-ledger-checkpoints-"))
            self._repo = git.Repo.init(self._dir, bare=True)
            self._repo.git.update_environment(GIT_TERMINAL_PROMPT="0", LC_ALL="C")
        return self._repo

    def close(self) -> None:
        if self._repo is not None:
            self._repo.close()
            self._repo = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> CheckpointRepo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _git_error(self, exc: Any, doing: str) -> CheckpointRepoError:
        lines = [line for line in str(getattr(exc, "stderr", "") or exc).strip().strip("'").splitlines() if line.strip()]
        why = lines[-1].strip().removeprefix("stderr: ").strip("' ") if lines else str(exc)
        why = why.replace(self.url, self.shown)
        return CheckpointRepoError(f"cannot {doing} {self.shown}: {why}",
                                   hint="check --checkpoint-repo / LEDGER_CHECKPOINT_REPO and this host's git access")

    def fetch(self) -> str | None:
        """The hub's ref now (a commit id), or None when it does not exist yet."""
        import git

        repo = self._scratch()
        try:
            repo.git.fetch("--no-tags", "--quiet", self.url, f"+{self.ref}:{_TIP}")
        except git.GitCommandError as exc:
            if "couldn't find remote ref" in str(exc.stderr):
                return None
            raise self._git_error(exc, "fetch checkpoints from") from exc
        return repo.git.rev_parse(_TIP)

    # -- reading ------------------------------------------------------------------------
    def history(self) -> list[Signed]:
        """Every checkpoint on the ref, oldest first; [] when the ref does not exist."""
        tip = self.fetch()
        if tip is None:
            return []
        repo = self._scratch()
        found = [self._read(commit) for commit in repo.iter_commits(tip, first_parent=True)]
        found.reverse()
        return found

    def _read(self, commit: Any) -> Signed:
        source = f"{self.ref}@{commit.hexsha[:12]}"

        def text(name: str) -> bytes:
            try:
                return (commit.tree / name).data_stream.read()
            except KeyError:
                return b""

        return Signed(text(BODY_FILE), text(SIGNATURE_FILE).decode("utf-8", "replace"), source)

    def default_branch_file(self, path: str = ALLOWED_SIGNERS_PATH) -> bytes | None:
        """A file on the hub's default branch (its HEAD), fetched shallow; None if absent."""
        import git

        repo = self._scratch()
        try:
            repo.git.fetch("--no-tags", "--quiet", "--depth", "1", self._fetch_url(), f"+HEAD:{_HUB_HEAD}")
            return (repo.commit(_HUB_HEAD).tree / path).data_stream.read()
        except KeyError:
            return None
        except git.GitCommandError as exc:
            if "couldn't find remote ref" in str(exc.stderr):  # an empty repository
                return None
            raise self._git_error(exc, "read the default branch of") from exc

    def _fetch_url(self) -> str:
        # git makes shallow fetches only over a transport: a plain path becomes file://.
        path = Path(self.url)
        return path.resolve().as_uri() if "://" not in self.url and path.exists() else self.url

    # -- publishing ---------------------------------------------------------------------
    def _commit(self, signed: Signed, parent: str | None, message: str) -> str:
        import git
        from git.objects.fun import tree_to_stream
        from gitdb import IStream

        repo = self._scratch()

        def store(kind: str, data: bytes) -> bytes:
            return repo.odb.store(IStream(kind, len(data), io.BytesIO(data))).binsha

        entries = [(store("blob", signed.body), 0o100644, BODY_FILE),
                   (store("blob", signed.signature.encode()), 0o100644, SIGNATURE_FILE)]
        buffer = io.BytesIO()
        tree_to_stream(sorted(entries, key=lambda e: e[2]), buffer.write)
        tree = store("tree", buffer.getvalue()).hex()
        who = git.Actor(*_AUTHOR)
        parents = [repo.commit(parent)] if parent else []
        commit = git.Commit.create_from_tree(repo, tree, message, parent_commits=parents, head=False,
                                             author=who, committer=who)
        return commit.hexsha

    def publish(self, signed: Signed, message: str) -> str:
        """Add a commit holding `signed` on top of the hub's ref and push it; its id.

        Another publisher pushing first only means fetching and building again. A ref moved
        back to an ancestor of what this process pushed (a rollback of the ref itself) is
        logged and repaired: the new commit goes on top of our own last one.
        """
        import git

        repo = self._scratch()
        for _ in range(PUSH_ATTEMPTS):
            tip = self.fetch()
            parent = tip
            mine = self._last_pushed
            if mine is not None and tip != mine and (tip is None or not repo.is_ancestor(mine, tip)):
                if tip is None or repo.is_ancestor(tip, mine):
                    log.error("%s at %s was moved back behind checkpoint commit %s that this process "
                              "pushed: publishing on top of it again", self.ref, self.shown, mine[:12])
                    parent = mine
                else:
                    log.error("%s at %s no longer contains checkpoint commit %s that this process pushed: "
                              "the ref was rewritten", self.ref, self.shown, mine[:12])
            commit = self._commit(signed, parent, message)
            try:
                repo.git.push("--quiet", self.url, f"{commit}:{self.ref}")
            except git.GitCommandError as exc:
                if any(w in str(exc.stderr) for w in ("rejected", "fetch first", "cannot lock ref")):
                    continue  # someone pushed meanwhile: build on theirs
                raise self._git_error(exc, "push checkpoints to") from exc
            self._last_pushed = commit
            return commit
        raise CheckpointRepoError(f"cannot push checkpoints to {self.shown}: the ref kept moving",
                                  hint=f"{PUSH_ATTEMPTS} attempts lost the race to other publishers")
