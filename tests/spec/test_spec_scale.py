"""A generated 10,000-file jobs repository validates in under 10 seconds."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from ledger.spec import validate_paths

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from spec_bench import generate  # noqa: E402


@pytest.mark.slow
def test_ten_thousand_files_validate_in_under_ten_seconds(tmp_path):
    generate(tmp_path, 10_000)
    wall, cpu = time.perf_counter(), time.process_time()
    results = validate_paths([tmp_path], tmp_path)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert len(results) == 10_000 + 7  # the generated jobs and the template's examples
    assert all(r.ok for r in results), next(r.errors[0].format() for r in results if not r.ok)
    assert len({r.job_id for r in results}) == len(results)
    print(f"10,000 files: {wall:.2f} s wall, {cpu:.2f} s CPU")
    # CPU time is what validation costs; wall time also counts other processes on a
    # shared machine, so it gets a looser bound (docs/bench/spec.md has the figures).
    assert cpu < 10.0
    assert wall < 30.0
