"""The notifier reads the one policy model: the documented `notify:` example is a valid policy,
and whatever `ledger validate` refuses in a policy file, `ledger notify --policy` refuses too."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ledger.errors import LedgerError
from ledger.spec.config import load_repo_config
from ledger.spec.policy import NotifyPolicy, load_policy, parse_policy


def documented_example() -> str:
    doc = NotifyPolicy.__doc__ or ""
    return textwrap.dedent(doc[doc.index("    notify:"):]).strip() + "\n"


def test_the_documented_notify_section_validates_and_parses():
    text = documented_example()
    assert list(load_repo_config(policy_text=text).errors) == []
    notify = parse_policy(text).policy.notify
    assert notify.owners["carol"].opt_out == frozenset({"email"})
    assert notify.owners["bob"].opt_out == frozenset({"webhook", "email"})
    assert notify.sender == "tpu-ledger@example.org"
    assert notify.webhook == "https://hooks.slack.com/services/..."


@pytest.mark.parametrize(("bad", "line"), [
    ("notify:\n  owners:\n    bob: {opt_out: [sms]}\n", 3),
    ("notify:\n  events: [started]\n", 2),
    ("notify:\n  owners:\n    a: {opt_out: sometimes}\n", 3),
    ("notify: [webhook]\n", 1),
    ("notify:\n  webhok: https://x.example/\n", 2),
])
def test_what_validate_refuses_the_notifier_refuses(tmp_path: Path, bad: str, line: int):
    errors = load_repo_config(policy_text=bad).errors
    assert errors and errors[0].line == line
    path = tmp_path / "policy.yaml"
    path.write_text(bad)
    with pytest.raises(LedgerError, match=rf"^{path}:{line}:\d+: "):
        load_policy(path)


def test_the_notifier_reads_files_through_the_hardened_loader(tmp_path: Path):
    bomb = tmp_path / "policy.yaml"
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)))
    with pytest.raises(LedgerError, match=rf"^{bomb}:\d+:\d+: "):
        load_policy(bomb)
    python = tmp_path / "python.yaml"
    python.write_text("notify: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(LedgerError, match=rf"^{python}:1:\d+: "):
        load_policy(python)
    with pytest.raises(LedgerError, match="no policy file"):
        load_policy(tmp_path / "absent.yaml")
