"""Governed configuration and tenancy, as the attacks of issue 31 tried them (real hub, `git
push`, SQLite): an unreviewed change of aliases, and a job filed under another owner."""

from __future__ import annotations

import ast
from pathlib import Path

from gitops_helpers import ALICE, BOB, CAROL, CODEOWNERS, Hub, spec

from ledger import resources
from ledger.gitops import ingest
from ledger.spec import layout
from ledger.spec.layout import is_governed

ROOT = Path(__file__).resolve().parents[2]
ALIASES = ("tpus:\n  pool:\n    name: {name}\n    zone: us-central2-b\n    accelerator: v4-32\n"
           "config:\n  lr: config.training.learning_rate\n{extra}")
POLICY = "approval:\n  mode: trailers\n  required: 1\n  approvers: codeowners\n"
POOL_JOB = "tpu: pool\ncommand:\n  run: python train.py\nargs: {lr: 0.1}\n"


def events(store, stream: str) -> list:
    return list(store.read_stream(stream))


def test_an_unreviewed_change_of_aliases_is_rejected_and_the_old_aliases_stay(hub: Hub, store):
    hub.bootstrap()
    hub.commit({".ledger/aliases.yaml": ALIASES.format(name="lab-pool", extra="")}, "the pool", author=BOB,
               approvers=(ALICE,))
    # mallory-as-alice pushes straight to main: the pool now names her node, and `lr`
    # smuggles in a hook; no approval
    evil = ALIASES.format(name="alice-owned-node", extra="  evil: config.evil_hook\n").replace(
        "config.training.learning_rate", "config.training.learning_rate --config.evil_hook=0.01")
    bad = hub.commit({".ledger/aliases.yaml": evil}, "tweak aliases", author=ALICE)
    hub.commit({"jobs/bob/run.yaml": POOL_JOB}, "bob's job", author=BOB, approvers=(ALICE,))
    hub.push()
    ingest(hub.bare, store, "main")
    [rej] = [e for e in events(store, "_git:main") if e.type == "rejected"]
    assert rej.data["commit"] == bad and rej.data["path"] == ".ledger/aliases.yaml"
    assert "not approved" in rej.data["reason"] and "the old file stays in force" in rej.data["reason"]
    [sub] = events(store, "bob/run")
    assert sub.type == "submitted" and sub.data["spec"]["tpu"]["name"] == "lab-pool"
    assert "evil_hook" not in str(sub.data["spec"])


def test_an_approved_alias_counts_for_a_job_in_the_same_commit(hub: Hub, store):
    hub.bootstrap()
    hub.commit({".ledger/aliases.yaml": ALIASES.format(name="lab-pool", extra=""), "jobs/bob/run.yaml": POOL_JOB},
               "pool and job", author=BOB, approvers=(ALICE,))
    hub.push()
    ingest(hub.bare, store, "main")
    [sub] = events(store, "bob/run")
    assert sub.type == "submitted" and sub.data["spec"]["tpu"]["name"] == "lab-pool"


def test_anything_under_ledger_is_governed_even_files_no_version_reads_yet(hub: Hub, store):
    hub.bootstrap()
    bad = hub.commit({".ledger/templates/default.yaml": "x: 1\n"}, "a template", author=CAROL)
    hub.push()
    ingest(hub.bare, store, "main")
    [rej] = [e for e in events(store, "_git:main") if e.type == "rejected"]
    assert rej.data["commit"] == bad and rej.data["path"] == ".ledger/templates/default.yaml"


def test_a_job_filed_under_another_owner_is_rejected_unless_the_owner_or_a_delegate_agreed(hub: Hub, store):
    hub.bootstrap()
    steal = "tpu: {accelerator: v4-8, zone: us-central2-b}\nssh:\n  private_key: secret://id_rsa\n" \
            "command:\n  run: cat ~/.ssh/*\n"
    # alice's own PR, approved by an owner of jobs/bob/ (CODEOWNERS: /jobs/bob/ @alice, and
    # `*` @alice: here carol approves as a policy approver would)
    hub.commit({"CODEOWNERS": CODEOWNERS + "/jobs/bob/ @carol\n"}, "carol reviews bob's folder", author=BOB,
               approvers=(ALICE,))
    stolen = hub.commit({"jobs/bob/steal.yaml": steal}, "Add a job", author=ALICE, approvers=(CAROL,))
    hub.commit({"jobs/bob/agreed.yaml": spec()}, "for bob", author=ALICE, approvers=(CAROL, BOB))
    hub.push()
    ingest(hub.bare, store, "main")
    [rej] = events(store, "bob/steal")
    assert rej.type == "rejected" and rej.data["commit"] == stolen
    assert rej.data["reason"].startswith("not allowed: a job under jobs/bob/ runs with bob's secrets and quota")
    assert "Alice Ng <alice@lab.org>" in rej.data["reason"]
    assert events(store, "bob/agreed")[0].type == "submitted"  # bob's own trailer: his consent
    # a delegate the policy names may file for bob
    hub.commit({".ledger/policy.yaml": POLICY + "delegates:\n  bob: [alice@lab.org]\n"}, "alice files for bob",
               author=BOB, approvers=(ALICE,))
    hub.commit({"jobs/bob/steal.yaml": spec()}, "again", author=ALICE, approvers=(CAROL,))
    hub.push()
    ingest(hub.bare, store, "main")
    assert [e.type for e in events(store, "bob/steal")] == ["rejected", "submitted"]


def _code_paths() -> set[str]:
    """Repository-relative paths the product's code names: string constants of the form
    `.ledger/...`, `CODEOWNERS`, or built from ledger.spec.layout."""
    found: set[str] = set()
    for path in (ROOT / "ledger").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if text.startswith(".ledger/") and " " not in text and "\n" not in text:
                    found.add(text)
    for name in dir(layout):
        value = getattr(layout, name)
        values = value if isinstance(value, tuple) else (value,)
        found.update(v for v in values if isinstance(v, str) and (v.startswith(".ledger/") or v.endswith("CODEOWNERS")))
    return found


# Files of the template the ledger never reads, and why they may change without the admins.
NOT_CONFIGURATION = {
    "README.md": "documentation for people",
    ".pre-commit-config.yaml": "runs `ledger validate` on a user's machine; decides nothing",
    ".github/workflows/validate.yml": "the CI check of pull requests; decides nothing the watcher does",
}


def test_every_configuration_file_is_governed():
    """A new configuration file (in the template, or named by the code) cannot slip past:
    it is governed, or listed above with the reason it changes nothing a job does."""
    template = resources.template_dir()
    files: list[str] = []

    def walk(node, prefix: str = "") -> None:
        for entry in node.iterdir():
            rel = f"{prefix}{entry.name}"
            if entry.is_dir():
                walk(entry, rel + "/")
            else:
                files.append(rel)

    walk(template)
    config = [f for f in files if not f.startswith("jobs/")]
    assert ".ledger/aliases.yaml" in config and "CODEOWNERS" in config
    ungoverned = [f for f in config if not is_governed(f) and f not in NOT_CONFIGURATION]
    assert ungoverned == []
    named = _code_paths()
    assert {".ledger/policy.yaml", ".ledger/aliases.yaml", ".ledger/allowed_signers", "CODEOWNERS"} <= named
    assert [p for p in named if not is_governed(p)] == []
    for written_by_init in (".ledger/schemas/job.schema.json", ".ledger/schemas/policy.schema.json"):
        assert is_governed(written_by_init)
