"""The notifier's documented `notify:` section is a valid policy, and what the schema refuses
the notifier refuses too: one contract between .ledger/policy.yaml and `ledger notify`."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from ledger.errors import UsageError
from ledger.fanout import notify_plan
from ledger.spec import load_repo_config


def documented_example() -> str:
    doc = notify_plan.__doc__ or ""
    block = doc[doc.index("    notify:"):doc.index("A job's owner")]
    return textwrap.dedent(block)


def test_the_documented_notify_section_validates_and_parses():
    text = documented_example()
    config = load_repo_config(policy_text=text)
    assert list(config.errors) == []
    policy = notify_plan.parse_policy(yaml.safe_load(text))
    assert policy.owners["carol"].opt_out == frozenset({"email"})
    assert policy.sender == "tpu-ledger@example.org"


@pytest.mark.parametrize("bad", [
    "notify:\n  owners:\n    bob: {opt_out: [sms]}\n",
    "notify:\n  events: [started]\n",
])
def test_what_the_schema_refuses_the_notifier_refuses(bad: str):
    assert list(load_repo_config(policy_text=bad).errors)
    with pytest.raises(UsageError):
        notify_plan.parse_policy(yaml.safe_load(bad))
