"""Where things live in a jobs repository: every path the product knows, defined once.

    jobs/<owner>/<name>.yaml      one file per job; the job id is <owner>/<name>
    .ledger/policy.yaml           who approves, notifications, defaults and limits
    .ledger/aliases.yaml          named shared TPUs and config aliases
    .ledger/allowed_signers       SSH keys whose signatures count (approval.signatures)
    CODEOWNERS                    who reviews which paths (looked up in CODEOWNERS_PATHS)

Every file under `.ledger/` and every CODEOWNERS is *governed* (`is_governed`): a change to
it takes effect only with the approval the policy in force asks for, whether the ledger
reads the file today or only a later version will.

`ledger validate`, the watcher, `ledger plan` and the notifier all read these names from
here; the checks of an owner's or a job's name are in `ledger.spec.names`.
"""

from __future__ import annotations

JOBS_DIR = "jobs"
JOB_SUFFIXES = (".yaml", ".yml")  # `.yml` is recognised, then refused with a hint to rename
LEDGER_DIR = ".ledger"
POLICY_PATH = f"{LEDGER_DIR}/policy.yaml"
ALIASES_PATH = f"{LEDGER_DIR}/aliases.yaml"
# Who may sign merges and approvals when the policy says `approval.signatures: required`:
# an OpenSSH allowed-signers file (git's `gpg.ssh.allowedSignersFile`). A fixed path, so the
# set of files that govern approval never depends on the files themselves.
ALLOWED_SIGNERS_PATH = f"{LEDGER_DIR}/allowed_signers"
CONFIG_FILES = (ALIASES_PATH, POLICY_PATH)  # the repository's own settings, checked first
# Where a host looks for CODEOWNERS; the first one present wins (GitHub: .github/, the root,
# then docs/; GitLab also reads .gitlab/).
CODEOWNERS_PATHS = (".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS", ".gitlab/CODEOWNERS")


def is_governed(path: str | None) -> bool:
    """True for the files that change what a job does or who may approve it: anything
    under .ledger/ (the policy, aliases, allowed signers, schemas, whatever comes later)
    and CODEOWNERS wherever a host looks for it."""
    return bool(path) and (path.startswith(LEDGER_DIR + "/") or path in CODEOWNERS_PATHS)


def is_job_path(path: str) -> bool:
    """True for repo-relative paths under jobs/ that look like job files (valid or not)."""
    return path.startswith(JOBS_DIR + "/") and path.endswith(JOB_SUFFIXES)
