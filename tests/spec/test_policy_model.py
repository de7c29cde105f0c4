"""The one typed model of `.ledger/policy.yaml` (pure: no git, no server)."""

from __future__ import annotations

import dataclasses

import pytest

from ledger.resources import load_schema, template_dir
from ledger.spec.layout import POLICY_PATH
from ledger.spec.policy import (
    CHANNELS,
    SECTIONS,
    ApprovalPolicy,
    Limits,
    NotifyOwner,
    Policy,
    parse_policy,
)
from ledger.spec.yamlsafe import MAX_BYTES, MAX_DEPTH

FULL = """\
approval:
  mode: trailers
  required: 2
  approvers: [" alice@lab.org ", "@bob"]
notify:
  webhook: https://hooks.example/x
  from: ledger@lab.org
  events: [failed, preempted]
  owners:
    alice: {email: alice@lab.org}
    bob: {email: bob@lab.org, opt_out: true}
    carol: {opt_out: [email]}
defaults:
  recovery: {max_restarts: 5}
  tpu: {zone: us-central2-b}
limits:
  max_restarts: 50
  max_priority: 600
  accelerators: [v4-8, v4-32]
  zones: [us-central2-b]
ignore:
  - jobs/examples/*
x-team-notes: anything under an x- key is the user's own
"""


def parsed(text: str) -> Policy:
    policy, errors = parse_policy(text)
    assert errors == (), [m.format() for m in errors]
    return policy


def test_no_file_an_empty_file_and_comments_are_the_defaults():
    assert parse_policy(None) == (Policy(), ())
    assert parse_policy("") == (Policy(), ())
    assert parse_policy("# nothing yet\n") == (Policy(), ())
    p = Policy()
    assert p.approval == ApprovalPolicy(mode="either", required=1, approvers=None)
    assert p.notify.webhook is None and p.notify.sender == "tpu-ledger@localhost" and p.notify.owners == {}
    assert p.notify.events == frozenset({"rejected", "quarantined", "preempted", "failed", "finished", "cancelled"})
    assert dict(p.defaults.spec) == {}
    assert p.limits == Limits(max_restarts=None, max_priority=None, accelerators=(), zones=())
    assert p.ignore.globs == () and not p.ignore.matches("jobs/alice/a.yaml")


def test_every_section_is_typed():
    p = parsed(FULL)
    assert p.approval == ApprovalPolicy(mode="trailers", required=2, approvers=("alice@lab.org", "@bob"))
    n = p.notify
    assert (n.webhook, n.sender, n.events) == ("https://hooks.example/x", "ledger@lab.org", frozenset({"failed", "preempted"}))
    assert n.owners["alice"] == NotifyOwner("alice@lab.org", frozenset())
    assert n.owners["bob"].opt_out == frozenset(CHANNELS)
    assert n.owners["carol"] == NotifyOwner(None, frozenset({"email"}))
    assert n.owner("dave") == NotifyOwner() and n.owner(None) == NotifyOwner()
    assert dict(p.defaults.spec) == {"recovery": {"max_restarts": 5}, "tpu": {"zone": "us-central2-b"}}
    assert p.limits == Limits(max_restarts=50, max_priority=600, accelerators=("v4-8", "v4-32"), zones=("us-central2-b",))
    assert p.ignore.matches("jobs/examples/pod.yaml") and not p.ignore.matches("jobs/alice/pod.yaml")


def test_the_policy_is_frozen():
    p = parsed(FULL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.approval = ApprovalPolicy("either", 1, None)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.limits.max_restarts = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.notify.owners["eve"] = NotifyOwner()  # type: ignore[index]
    with pytest.raises(TypeError):
        p.defaults.spec["tpu"] = {}  # type: ignore[index]


@pytest.mark.parametrize(("text", "line", "column", "pointer", "hint"), [
    ("approval: {mode: either}\nbudgets: {ml: [alice]}\n", 2, 1, "/budgets", "fields allowed here"),
    ("approval:\n  mode: either\n  requried: 2\n", 3, 3, "/approval/requried", "did you mean `required`?"),
    ("notify:\n  owners:\n    alice: {email: a@b.c, phone: '1'}\n", 3, 27, "/notify/owners/alice/phone", ""),
    ("limits:\n  max_gpus: 8\n", 2, 3, "/limits/max_gpus", ""),
])
def test_unknown_keys_are_refused_with_their_line(text, line, column, pointer, hint):
    policy, errors = parse_policy(text)
    assert [(m.file, m.line, m.column, m.pointer) for m in errors] == [(POLICY_PATH, line, column, pointer)]
    assert errors[0].message.startswith("unknown field") and hint in errors[0].hint
    assert errors[0].format().startswith(f"{POLICY_PATH}:{line}:{column}: error: ")


def test_a_broken_block_falls_back_alone():
    text = "approval:\n  mode: sometimes\nnotify:\n  owners: {alice: {email: alice@lab.org}}\nlimits: {max_restarts: -1}\n"
    policy, errors = parse_policy(text, file="hub/.ledger/policy.yaml")
    assert [(m.file, m.line, m.pointer) for m in errors] == [
        ("hub/.ledger/policy.yaml", 2, "/approval/mode"), ("hub/.ledger/policy.yaml", 5, "/limits/max_restarts")]
    assert policy.approval.mode == "trailers"  # the strict rule while the block is broken
    assert policy.limits == Policy().limits  # no limit rather than a half-read one
    assert policy.notify.owners["alice"].email == "alice@lab.org"  # the good block is kept


def test_a_check_the_schema_cannot_make_reports_its_line_and_breaks_its_block():
    text = "limits:\n  max_restarts: 3\n  accelerators: [v4-8, v9-1]\nignore: [jobs/examples/*]\n"
    policy, errors = parse_policy(text)
    assert [(m.line, m.column, m.pointer) for m in errors] == [(3, 24, "/limits/accelerators/1")]
    assert "'v9-1', which is not a Cloud TPU type" in errors[0].message
    assert policy.limits == Policy().limits and policy.ignore.globs == ("jobs/examples/*",)


HOSTILE = {  # id: (text, line of the error; 0 = the whole file)
    # a billion laughs: alias expansion is budgeted
    "laughs": ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)), 7),
    "python-tag": ("approval: !!python/object/apply:os.system ['true']\n", 1),  # never constructed
    "duplicate-key": ("approval: {mode: either}\napproval: {mode: merge-commit}\n", 2),  # no silent winner
    "deep": ("approval:" + " [" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n", 1),
    "big": ("x-pad: '" + "x" * (MAX_BYTES + 10) + "'\n", 0),
    "syntax": ("approval: {mode: [unclosed\n", 2),
    "list": ("- just\n- a list\n", 1),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_files_are_refused_by_the_hardened_loader(case):
    text, line = HOSTILE[case]
    policy, errors = parse_policy(text)
    assert [(m.file, m.line, m.pointer, m.severity) for m in errors] == [(POLICY_PATH, line, "", "error")]
    # nothing of the file is used; approval is the strict fallback
    assert policy.approval.mode == "trailers" and policy.notify == Policy().notify


def test_the_template_policy_is_valid():
    text = (template_dir() / ".ledger" / "policy.yaml").read_text()
    p = parsed(text)
    assert p.ignore.matches("jobs/examples/single-host.yaml") and p.limits.max_restarts == 50


def test_sections_and_schema_blocks_are_the_same_set():
    """Adding a section is a schema block plus a Section dataclass; neither alone."""
    schema = load_schema("policy")
    assert set(SECTIONS) == set(schema["properties"])
    for name, cls in SECTIONS.items():
        assert name == cls.KEY and dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert schema["additionalProperties"] is False
    opt_out = schema["properties"]["notify"]["properties"]["owners"]["additionalProperties"]["properties"]["opt_out"]
    assert tuple(opt_out["anyOf"][1]["items"]["enum"]) == CHANNELS


def test_the_same_text_is_parsed_once():
    assert parse_policy(FULL) is parse_policy(FULL)
