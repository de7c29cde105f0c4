"""Job specs: what a valid job is, how a bad one is refused, and the normalized form.

A job is `jobs/<owner>/<name>.yaml` in the jobs repository; its id is `<owner>/<name>`.
Everything here is pure except `validate_paths` and `load_repo_config(root)`, which read
files. See schemas/job.schema.json for the fields and jobs-repo-template/ for examples.
"""

from ledger.spec.config import DEFAULT_CONFIG_ALIASES, RepoConfig, load_repo_config
from ledger.spec.files import find_repo_root, is_ignored, validate_paths
from ledger.spec.layout import ALIASES_PATH, POLICY_PATH, is_job_path
from ledger.spec.model import Message, SpecResult, spec_hash
from ledger.spec.names import default_tpu_name, job_id_from_path
from ledger.spec.normalize import command_args, validate_text
from ledger.spec.policy import Policy, load_policy, parse_policy
from ledger.spec.recovery import SHORTHAND, recovery_rules
from ledger.spec.yamlsafe import MAX_BYTES, MAX_DEPTH

__all__ = [
    "ALIASES_PATH",
    "DEFAULT_CONFIG_ALIASES",
    "MAX_BYTES",
    "MAX_DEPTH",
    "POLICY_PATH",
    "Policy",
    "SHORTHAND",
    "Message",
    "RepoConfig",
    "SpecResult",
    "command_args",
    "default_tpu_name",
    "find_repo_root",
    "is_ignored",
    "is_job_path",
    "job_id_from_path",
    "load_policy",
    "load_repo_config",
    "parse_policy",
    "recovery_rules",
    "spec_hash",
    "validate_paths",
    "validate_text",
]
