"""Bounded work per spec: reference bombs, deep chains, too many expansions, a normalised spec
that is too big, and a file far over the size limit. Each is refused naming the field, with
memory measured by tracemalloc (how fast is bench/hostile_bench.py's business)."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from ledger.spec import normalize
from ledger.spec.interpolate import MAX_DEPTH, MAX_EXPANSIONS, MAX_OUTPUT_CHARS, MAX_VALUE_CHARS
from ledger.spec.normalize import validate_text

HEAD = "tpu: {accelerator: v4-8, zone: us-central2-b}\ncommand:\n  cmd: echo $E1\n  env:\n"
ROOT = Path(__file__).resolve().parents[2]


def bomb(levels: int = 7, fanout: int = 10, seed: str = "0123456789") -> str:
    """The issue's bomb: each env value holds `fanout` copies of the previous one."""
    lines = [f'    E0: "{seed}"\n']
    for i in range(1, levels + 1):
        lines.append(f'    E{i}: "' + ("${command.env.E" + str(i - 1) + "}") * fanout + '"\n')
    return HEAD + "".join(lines)


def refused(text: str, config, path: str = "jobs/alice/bomb.yaml"):
    tracemalloc.start()
    try:
        result = validate_text(text, path, config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not result.ok and result.spec is None
    assert peak < 50 * 1024 * 1024, f"peak {peak:,} bytes"
    return result.errors


def test_the_issues_bomb_is_refused_naming_the_field(config):
    text = bomb()
    assert len(text) < 1400  # a 1.4 KB file that once expanded to 111 MB
    [err] = refused(text, config)
    assert (err.pointer, err.line, err.column) == ("/command/env/E4", 9, 9)
    assert err.message == f"`command.env.E4` expands to more than {MAX_VALUE_CHARS:,} characters (the limit)"


@pytest.mark.parametrize(("levels", "fanout", "limit"), [
    (10, 10, "expands to more than"), (5, 100, "expands to more than"),
    (20, 2, "nested more than 10 deep"),  # 2^11 x 10 characters: the depth limit comes first
])
def test_bigger_bombs_are_refused_just_the_same(config, levels, fanout, limit):
    [err] = refused(bomb(levels, fanout), config)
    assert err.pointer.startswith("/command/env/E") and limit in err.message


def test_a_chain_deeper_than_the_limit_is_refused(config):
    lines = ['    E0: "x"\n'] + [f'    E{i}: "${{command.env.E{i - 1}}}y"\n' for i in range(1, MAX_DEPTH + 3)]
    errs = refused(HEAD + "".join(lines), config)
    assert any(f"nested more than {MAX_DEPTH} deep" in e.message for e in errs), [e.message for e in errs]


def test_too_many_expansions_are_refused(config):
    text = HEAD + '    E0: "' + "${job.name}" * (MAX_EXPANSIONS + 1) + '"\n'
    [err] = refused(text, config)
    assert err.pointer == "/command/env/E0" and f"more than {MAX_EXPANSIONS:,} references" in err.message


def test_the_sum_of_expanded_values_is_bounded(config):
    fields = MAX_OUTPUT_CHARS // (MAX_VALUE_CHARS // 2) + 1
    seed = "z" * 1000
    lines = [f'    S: "{seed}"\n'] + [f'    F{i}: "' + "${command.env.S}" * (MAX_VALUE_CHARS // 2000) + '"\n' for i in range(fields)]
    [err] = refused(HEAD + "".join(lines), config)
    assert err.pointer.startswith("/command/env/F") and f"over {MAX_OUTPUT_CHARS:,} characters" in err.message


def test_a_normalised_spec_over_the_limit_is_refused_naming_its_biggest_section(config, monkeypatch):
    monkeypatch.setattr(normalize, "MAX_SPEC_BYTES", 4096)
    text = "tpu: {accelerator: v4-8, zone: us-central2-b}\ncommand:\n  cmd: |\n" + "    echo padding\n" * 400
    [err] = refused(text, config)
    assert err.pointer == "/command" and "the normalised spec is" in err.message and "over the limit of 4,096" in err.message


def test_the_same_references_within_limits_still_work(config):
    result = validate_text(bomb(levels=2, fanout=3, seed="ab"), "jobs/alice/ok.yaml", config)
    assert result.ok, [e.format() for e in result.errors]
    assert result.spec["command"]["env"]["E2"] == "ab" * 9


def test_ledger_validate_reports_an_oversized_files_real_size_and_the_bomb(tmp_path):
    jobs = tmp_path / "jobs" / "alice"
    jobs.mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    (jobs / "big.yaml").write_bytes(b"#" * 12_000_000 + b"\n")
    (jobs / "bomb.yaml").write_text(bomb())
    proc = subprocess.run([sys.executable, "-m", "ledger", "validate", str(tmp_path / "jobs")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1, proc.stderr  # a data problem, never 2 (usage)
    assert "jobs/alice/big.yaml: error: file is 12,000,001 bytes, over the 256 KiB limit" in proc.stdout
    assert "jobs/alice/bomb.yaml:9:9: error: `command.env.E4` expands to more than" in proc.stdout
