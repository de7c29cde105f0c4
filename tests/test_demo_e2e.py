"""The demo's story as a test: the README's first command, checked event by event."""

from __future__ import annotations

import os
from pathlib import Path

from ledger.app.demo import EXPECTED, JOB_ID, run_demo
from ledger.store import open_store
from reconciler.remote import layout


def processes_under(root: Path) -> list[int]:
    """Live processes whose working directory lies under `root` (the emulator's hosts run
    every command in a sandbox there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd.startswith(str(root)):
            found.append(int(entry.name))
    return found


def test_demo_story_end_to_end(tmp_path: Path):
    lines: list[str] = []
    result = run_demo(tmp_path / "demo", say=lines.append, timeout=150)
    assert result.ok, result.problems
    # the exact sequence of the approved pod job, preemption and recovery included
    assert result.events == EXPECTED
    assert result.sneaky_events == ["rejected"]
    # who asked (alice wrote the job in pull request #1), who approved and who merged (sam)
    store = open_store(result.store_url)
    try:
        submitted = next(e for e in store.read_stream(JOB_ID) if e.type == "submitted")
    finally:
        store.close()
    sam = "Sam Steward <sam@lab.example>"
    assert (submitted.data["author"], submitted.data["author_name"], submitted.data["approvers"],
            submitted.data["merger"], submitted.data["pr"]) == ("alice@lab.example", "Alice Ng", [sam], sam, 1)
    assert (submitted.actor["name"], submitted.actor["merger"]) == ("Alice Ng", sam)
    assert any(f"asked by Alice Ng <alice@lab.example>, approved by {sam}, merged by {sam}" in line for line in lines)
    # the job saw its attempt number after the preemption, and resumed from its checkpoint
    second = layout.output_log(result.log_dir, JOB_ID, 2, 0).read_text()
    assert "attempt 2 on worker 0: resuming from step" in second and result.resumed_from >= 1
    assert second.rstrip().endswith("training done")
    # attempt 1 reported checkpoints (recorded before the preemption), and the report is
    # priced from the prices the admins put in the policy
    assert result.checkpoints and all(attempt == 1 for attempt, _ in result.checkpoints)
    assert result.usage is not None and result.usage.cost is not None and result.usage.lost_us > 0
    # nothing is left running: the emulator, its hosts' processes, the Pub/Sub emulator
    assert processes_under(tmp_path) == []
    assert not (tmp_path / "demo" / "emulator" / "emulator.json").exists()
    assert any("preempted" in line for line in lines)
