"""The template's examples and the seed configs validate; the invalid corpus fails exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.resources import template_dir
from ledger.spec.normalize import validate_text
from ledger.spec.recovery import recovery_rules

TEMPLATE_DIR = Path(str(template_dir()))  # a folder: the tests run from the source tree

FIXTURES = Path(__file__).parent / "fixtures"

EXAMPLES = sorted((TEMPLATE_DIR / "jobs" / "examples").glob("*.yaml"))
SEEDS = sorted((FIXTURES / "seeds").glob("*.yaml"))
INVALID = sorted((FIXTURES / "invalid").glob("*.yaml"))


def test_the_template_has_every_kind_of_example():
    names = {p.stem for p in EXAMPLES}
    assert {"single-host", "pod", "queued-resource", "docker", "conda", "venv", "shared-tpu"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_template_example_validates(path: Path, config):
    text = path.read_bytes()
    assert text.startswith(b"# yaml-language-server: $schema=../../.ledger/schemas/job.schema.json\n")
    result = validate_text(text, f"jobs/examples/{path.name}", config)
    assert result.ok, [m.format() for m in result.errors]
    assert result.warnings == [], [m.format() for m in result.warnings]
    assert result.job_id == f"examples/{path.stem}"
    assert result.spec["command"]["cmd"]


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.stem)
def test_seed_config_validates(path: Path, config):
    result = validate_text(path.read_bytes(), f"jobs/seed/{path.name}", config)
    assert result.ok, [m.format() for m in result.errors]
    assert result.job_id == f"seed/{path.stem}"


def test_seed_quickstart_normalizes_like_jobman(config):
    spec = validate_text((FIXTURES / "seeds" / "jobman-quickstart.yaml").read_bytes(), "jobs/yufeng/quick.yaml", config).spec
    assert spec["tpu"]["name"] == "yufeng-v6e-1"  # ${tpu.accelerator} interpolated
    assert spec["tpu"]["allocation_mode"] == "queued-resources"
    assert spec["tpu"]["hosts"] == 1
    assert spec["ssh"]["private_key"] == "secret://id_rsa"  # tpu_private_key spelling
    assert spec["setup"]["modules"] == ["gcsfuse", "ssh", "docker", "command"]
    assert spec["job"]["env_type"] == "docker"
    assert spec["command"] == {"cmd": "pip show jax\npip show flax\n", "workers": [0], "env": {}, "args_flags": []}
    assert spec["recovery"]["on_preempted"] == "reapply" and spec["recovery"]["on_grpc_error"] == "resume"


def test_seed_tpu_run_maps_the_tools_options(config):
    result = validate_text((FIXTURES / "seeds" / "tpu-run-shared.yaml").read_bytes(), "jobs/xibo/sweep.yaml", config)
    spec = result.spec
    assert spec["tpu"]["shared"] is True
    assert spec["tpu"]["name"] == "kmh-tpuvm-v2-32-preemptible-2"
    assert spec["tpu"]["pricing"] == "preemptible"
    rules = recovery_rules(spec)
    assert (rules["on_preempted"], rules["on_grpc_error"]) == ("reapply", "rerun")
    assert rules["pass_attempt"] is True and rules["attempt_flag"] == "--config.stage"
    assert spec["args"] == {"config.training.learning_rate": 0.01, "config.training.batch_size": 1024}
    full = validate_text((FIXTURES / "seeds" / "tpu-run-fullname.yaml").read_bytes(), "jobs/lyy/x.yaml", config).spec
    assert full["tpu"]["alias"] == "v2-32-6" and full["tpu"]["shared"]
    assert (full["recovery"]["on_preempted"], full["recovery"]["on_grpc_error"]) == ("pass", "resume")


def _expectations(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("# ") or ":" not in line:
            break
        key, _, value = line[2:].partition(":")
        out[key.strip()] = value.strip()
    return out


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_file_fails_with_pointer_and_message(path: Path, config):
    expect = _expectations(path)
    assert "message" in expect, f"{path.name} lacks its `# message:` header"
    result = validate_text(path.read_bytes(), f"jobs/alice/{path.name}", config)
    assert not result.ok and result.spec is None
    internal = [m.format() for m in result.errors if "internal error" in m.message]
    assert not internal, internal  # refused by a check, not by an exception turned into a finding
    found = [m for m in result.errors if m.pointer == expect["pointer"] and expect["message"] in m.message]
    assert found, f"expected {expect} in {[m.format() for m in result.errors]}"
    m = found[0]
    assert m.file == f"jobs/alice/{path.name}" and m.severity == "error" and m.hint
    if "hint" in expect:
        assert expect["hint"] in m.hint
    if "line" in expect:
        assert m.line == int(expect["line"]), m.format()
    assert m.column >= 1 if m.line else True
