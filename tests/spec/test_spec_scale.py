"""A generated 10,000-file jobs repository validates, every file, each under its own job id.

How long it takes is a figure, not a check (tests share 2 cores): bench/spec_bench.py prints
the wall and CPU time of the same 10,000 files (target: under 10 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ledger.spec.files import validate_paths

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from spec_bench import generate  # noqa: E402


@pytest.mark.slow
def test_ten_thousand_files_validate(tmp_path):
    generate(tmp_path, 10_000)
    results = validate_paths([tmp_path], tmp_path)
    assert len(results) == 10_000 + 9  # the generated jobs and the template's examples
    assert all(r.ok for r in results), next(r.errors[0].format() for r in results if not r.ok)
    assert len({r.job_id for r in results}) == len(results)
