"""The jobs repository's own settings: `.ledger/aliases.yaml` and `.ledger/policy.yaml`."""

from __future__ import annotations

from pathlib import Path

from ledger import tpu_types
from ledger.spec.model import Message, RepoConfig
from ledger.spec.schema import fill_defaults, problems
from ledger.spec.yamlsafe import MAX_BYTES, LoadError, load

ALIASES_PATH = ".ledger/aliases.yaml"
POLICY_PATH = ".ledger/policy.yaml"

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

DEFAULT_POLICY: dict = {
    "approval": {"mode": "either", "required": 1, "approvers": "codeowners"},
    "notify": {"owners": {}, "webhook": None},
    "defaults": {},
    "limits": {},
    "ignore": [],
}


def _parse(text: str | bytes | None, file: str, schema: str, errors: list[Message]) -> dict:
    if text is None:
        return {}
    try:
        loaded = load(text)
    except LoadError as exc:
        if exc.message == "file is empty":
            return {}  # an empty or all-comments file means "no settings": the defaults
        errors.append(Message(file, exc.line, exc.column, "", exc.message, exc.hint, "error"))
        return {}
    if not isinstance(loaded.data, dict):
        errors.append(Message(file, 1, 1, "", "the file must be a mapping", "see jobs-repo-template/.ledger/", "error"))
        return {}
    found = list(problems(schema, loaded.data))
    for p in found:
        line, column = loaded.position(p.pointer, key=p.at_key)
        errors.append(Message(file, line, column, p.pointer, p.message, p.hint, "error"))
    return {} if found else fill_defaults(schema, loaded.data)


def _read(root: Path | None, rel: str) -> bytes | None:
    if root is None:
        return None
    path = root / rel
    if not path.is_file():
        return None
    with path.open("rb") as fh:
        return fh.read(MAX_BYTES + 1)


def parse_aliases(text: str | bytes | None, errors: list[Message]) -> dict:
    raw = _parse(text, ALIASES_PATH, "aliases", errors)
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


def parse_policy(text: str | bytes | None, errors: list[Message]) -> dict:
    raw = _parse(text, POLICY_PATH, "policy", errors)
    out = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v) for k, v in DEFAULT_POLICY.items()}
    for key, value in raw.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def load_repo_config(
    root: Path | None = None, *, aliases_text: str | bytes | None = None, policy_text: str | bytes | None = None
) -> RepoConfig:
    """The repo config from files under `root`, or from texts given (e.g. git blobs)."""
    root = Path(root) if root is not None else None
    errors: list[Message] = []
    if aliases_text is None:
        aliases_text = _read(root, ALIASES_PATH)
    if policy_text is None:
        policy_text = _read(root, POLICY_PATH)
    aliases = parse_aliases(aliases_text, errors)
    policy = parse_policy(policy_text, errors)
    return RepoConfig(aliases=aliases, policy=policy, errors=tuple(errors))
