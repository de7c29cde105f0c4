"""A lab on the TPU emulator: the reconciler of tests/reconciler, given a sharing policy."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from emulator import Emulator
from ledger.app.queueview import LedgerPolicy, PolicyFile
from ledger.app.wiring import Settings
from ledger.spec.policy import Policy, parse_policy
from tests.reconciler.conftest import Harness

LAB_POLICY = """\
teams:
  "@lab/nlp": [alice, bob]
quotas:
  lab: {chips: {v4: 16}}
  users:
    alice: {chips: {v4: 4}}
  default_user: {chips: {v4: 16}}
priorities:
  classes: {low: 100, normal: 500, urgent: 900}
  preempt: {urgent: [low]}
fair_share:
  half_life_hours: 1
"""


@dataclass
class LabHarness(Harness):
    policy: Policy | None = None

    def settings(self, holder: str = "test-reconciler") -> Settings:
        settings = super().settings(holder)
        settings.policy = self.policy
        return settings

    def follow(self, path: Path | None, holder: str = "test-reconciler"):
        """A reconciler that follows the policy file at `path`, as `ledger reconcile --policy`,
        or (None) the rules recorded in the ledger, as `ledger reconcile` does by default."""
        source = PolicyFile(path, self.store_url, holder) if path else LedgerPolicy(self.store_url)
        self.policy = None
        return self.start(holder, policy_source=source)

    def use(self, text: str) -> None:
        policy, errors = parse_policy(text)
        assert errors == (), [m.format() for m in errors]
        self.policy = policy


@pytest.fixture
def lab_harness(tmp_path: Path) -> Iterator[LabHarness]:
    with Emulator(state_dir=tmp_path / "emulator") as emu:
        h = LabHarness(emu, f"sqlite:///{tmp_path / 'ledger.db'}", tmp_path)
        h.use(LAB_POLICY)
        try:
            yield h
        finally:
            h.close()
