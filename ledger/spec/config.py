"""The jobs repository's own settings: `.ledger/aliases.yaml`, `.ledger/policy.yaml`, and
(checked against the policy's teams) CODEOWNERS."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ledger import tpu_types
from ledger.spec.codeowners import parse_codeowners, team_problems
from ledger.spec.document import check_document, read_bounded
from ledger.spec.layout import ALIASES_PATH, CODEOWNERS_PATHS, POLICY_PATH
from ledger.spec.model import Message
from ledger.spec.policy import Policy, parse_policy
from ledger.spec.schema import fill_defaults

# The `tpu` tool's default config aliases; used when aliases.yaml does not list its own.
DEFAULT_CONFIG_ALIASES: dict[str, str] = {
    "lr": "config.training.learning_rate",
    "bs": "config.training.batch_size",
    "ep": "config.training.num_epochs",
    "wd": "config.training.weight_decay",
    "b1": "config.training.adam_b1",
    "b2": "config.training.adam_b2",
    "ckpt": "config.training.checkpoint_per_epoch",
}


@dataclass(frozen=True)
class RepoConfig:
    """Parsed `.ledger/aliases.yaml` and `.ledger/policy.yaml`, defaults filled.

    `errors` lists what was wrong with those files. A broken aliases file is replaced by
    its defaults, a broken policy block by its section's fallback, so that job validation
    still runs (and CI still shows every problem).
    """

    aliases: dict
    policy: Policy
    errors: tuple[Message, ...] = ()


def parse_aliases(text: str | bytes | None, errors: list[Message]) -> dict:
    checked = check_document(text, ALIASES_PATH, "aliases")
    errors.extend(checked.errors)
    raw = {} if checked.errors else fill_defaults("aliases", checked.data)
    tpus = raw.get("tpus", {})
    for alias, entry in tpus.items():
        if tpu_types.lookup(entry["accelerator"]) is None:
            errors.append(Message(
                ALIASES_PATH, 0, 0, f"/tpus/{alias}/accelerator",
                f"TPU alias {alias!r}: {entry['accelerator']!r} is not a Cloud TPU type",
                "use a type such as v4-32 or v5litepod-8", "error",
            ))
    by_name: dict[str, str] = {}
    for alias, entry in tpus.items():
        by_name.setdefault(entry["name"], alias)
    return {
        "tpus": tpus,
        "config": raw["config"] if "config" in raw else dict(DEFAULT_CONFIG_ALIASES),
        "tpu_names": by_name,  # full name -> alias, for `tpu: {name: ..., shared: true}`
    }


def load_repo_config(
    root: Path | None = None, *, aliases_text: str | bytes | None = None, policy_text: str | bytes | None = None
) -> RepoConfig:
    """The repo config from files under `root`, or from texts given (e.g. git blobs)."""
    root = Path(root) if root is not None else None
    errors: list[Message] = []
    if aliases_text is None:
        aliases_text = read_bounded(root / ALIASES_PATH) if root is not None else None
    if policy_text is None:
        policy_text = read_bounded(root / POLICY_PATH) if root is not None else None
    aliases = parse_aliases(aliases_text, errors)
    policy, policy_errors = parse_policy(policy_text)
    errors.extend(policy_errors)
    if root is not None:
        errors.extend(codeowners_problems(root, policy))
    return RepoConfig(aliases=aliases, policy=policy, errors=tuple(errors))


def codeowners_problems(root: Path, policy: Policy) -> list[Message]:
    """What is wrong with the repository's CODEOWNERS (the first one GitHub would read):
    lines GitHub skips, and team handles the policy does not define."""
    for rel in CODEOWNERS_PATHS:
        text = read_bounded(root / rel)
        if text is not None:
            owners = parse_codeowners(text.decode("utf-8", "replace"), rel)
            return [*owners.problems, *team_problems(owners, policy.teams)]
    return []
