"""Replay skips decoding `data` for the types listed in fold._DATA_FREE. That is only right
while their transitions really ignore data: this pins it, so a handler that starts reading
data fails here instead of making replay silently differ from evolve."""

from __future__ import annotations

import pytest

from ledger import fold

RICH_DATA = {
    "reason": "r", "attempt": 7, "tpu": {"name": "n", "zone": "z"}, "spec": {"job": {"priority": 3}},
    "kind": "grpc", "final": True, "exit_code": 3, "hosts": [{"worker": 0}], "action_id": "x",
}


@pytest.mark.parametrize("type_", sorted(fold._DATA_FREE))
@pytest.mark.parametrize("start", ["", "pending", "running", "cancelling", "finished"])
def test_types_replay_does_not_decode_ignore_their_data(type_: str, start: str):
    job = fold.initial("alice/a")
    job.state = start
    with_data = fold.evolve(job, type_, RICH_DATA, time="2026-01-01T00:00:00.000000Z", seq=5, version=5)
    without = fold.evolve(job, type_, {}, time="2026-01-01T00:00:00.000000Z", seq=5, version=5)
    assert with_data.to_dict() == without.to_dict()
