"""`tpu.fallbacks`, `tpu.failover` and `tpu.slices`: validated as complete placements, normalised
once, read through ledger.spec.placement."""

from __future__ import annotations

import json

from ledger.spec import placement as spec_placement
from ledger.spec.model import spec_hash
from ledger.spec.normalize import validate_text
from ledger.spec.placement import failover, placed_spec, placements

HEAD = """\
tpu:
  accelerator: v4-32
  zone: us-central2-b
  pricing: spot
"""
TAIL = "command: {cmd: python train.py, workers: all}\n"
FALLBACKS = """\
  failover: {stockouts: 2, prefer_first: true}
  fallbacks:
    - accelerator: v5litepod-32
      zone: us-west4-a
      gcsfuse: {bucket_name: ckpt-west}
      args: {bs: 64}
    - pricing: ondemand
gcsfuse: {bucket_name: ckpt-central, mount_path: /mnt/ckpt}
args: {lr: 0.1, bs: 128}
"""


def check(text: str, config):
    return validate_text(text, "jobs/alice/job.yaml", config)


def test_fallbacks_normalise_into_complete_choices(config):
    result = check(HEAD + FALLBACKS + TAIL, config)
    assert result.ok, [m.format() for m in result.errors]
    choices = placements(result.spec)
    assert [c.label() for c in choices] == [
        "v4-32 spot us-central2-b", "v5litepod-32 spot us-west4-a", "v4-32 ondemand us-central2-b"]
    # another family brings its own default runtime; an override of pricing keeps the block's
    assert [c.version for c in choices] == ["tpu-ubuntu2204-base", "v2-alpha-tpuv5-lite", "tpu-ubuntu2204-base"]
    assert failover(result.spec) == {"stockouts": 2, "wait_s": None, "prefer_first": True, "resume_across": False}
    west = placed_spec(result.spec, 1)
    assert west["tpu"]["accelerator"] == "v5litepod-32" and west["tpu"]["chips"] == 32 and west["tpu"]["hosts"] == 8
    assert west["gcsfuse"] == {"bucket_name": "ckpt-west", "mount_path": "/mnt/ckpt"}
    assert west["command"]["args_flags"] == ["--config.training.learning_rate=0.1", "--config.training.batch_size=64"]
    # a choice without overrides runs with the job's own settings
    assert placed_spec(result.spec, 2)["gcsfuse"] == result.spec["gcsfuse"]
    assert placed_spec(result.spec, 2)["command"]["args_flags"] == result.spec["command"]["args_flags"]
    assert placed_spec(result.spec, 0) is result.spec


def test_errors_name_the_fallback_and_its_field(config):
    text = HEAD + """\
  fallbacks:
    - accelerator: v4-33
    - zone: us-west4-a
      pricing: reserved
""" + TAIL
    result = check(text, config)
    errors = {m.pointer: m.message for m in result.errors}
    assert errors["/tpu/fallbacks/0/accelerator"].startswith("tpu.fallbacks[0].accelerator: 'v4-33' is not a Cloud TPU type")
    assert errors["/tpu/fallbacks/1"].startswith("tpu.fallbacks[1].reservation (from the tpu block): pricing is reserved")
    # v4 in us-west4-a: a warning at the field the fallback set
    warned = {m.pointer: m.message for m in result.warnings}
    assert "tpu.fallbacks[1].zone" in warned["/tpu/fallbacks/1/zone"]
    assert result.errors[0].line > 4  # positioned on the fallback, not the tpu block


def test_a_finding_of_the_tpu_block_is_not_repeated_per_fallback(config):
    text = HEAD.replace("us-central2-b", "us-west4-a") + "  fallbacks:\n    - pricing: ondemand\n" + TAIL
    result = check(text, config)
    assert [m.pointer for m in result.warnings] == ["/tpu/zone"]


def test_multislice_needs_a_queued_resource(config):
    result = check(HEAD + "  slices: 2\n" + TAIL, config)
    assert [(m.pointer, m.message.split(":")[0]) for m in result.errors] == [("/tpu/slices", "2 slices need `allocation_mode")]
    ok = check(HEAD + "  slices: 2\n  allocation_mode: queued-resources\n" + TAIL, config)
    assert ok.ok and placements(ok.spec)[0].slices == 2 and placements(ok.spec)[0].queued
    bad_alt = check(HEAD + "  fallbacks: [{slices: 4}]\n" + TAIL, config)
    assert [m.pointer for m in bad_alt.errors] == ["/tpu/fallbacks/0/slices"]


def test_workers_must_exist_in_every_choice(config):
    text = HEAD.replace("v4-32", "v4-64") + "  fallbacks: [{accelerator: v4-16}]\ncommand: {cmd: x, workers: [3]}\n"
    result = check(text, config)
    assert [m.pointer for m in result.errors] == ["/command/workers/0"]


def test_a_spec_without_the_new_keys_keeps_its_hash(config):
    result = check(HEAD + TAIL, config)
    assert "fallbacks" not in result.spec["tpu"] and "slices" not in result.spec["tpu"] and "failover" not in result.spec["tpu"]
    assert [c.slices for c in placements(result.spec)] == [1]
    assert spec_hash(result.spec) == spec_hash(check(HEAD + TAIL, config).spec)


def test_shared_tpus_have_no_fallbacks(config):
    shared = next(iter((config.aliases or {}).get("tpus") or {}), None)
    if shared is None:
        return
    result = check(f"tpu: {{alias: {shared}, fallbacks: [{{zone: us-west4-a}}]}}\n" + TAIL, config)
    assert [m.pointer for m in result.errors] == ["/tpu/fallbacks"]
    assert placements({"tpu": {"shared": True, "name": shared}}) == ()


def test_a_fallback_gcsfuse_needs_the_jobs_section(config):
    result = check(HEAD + "  fallbacks: [{zone: us-west4-a, accelerator: v5litepod-32, gcsfuse: {bucket_name: b-west}}]\n" + TAIL, config)
    assert [m.pointer for m in result.errors] == ["/tpu/fallbacks/0/gcsfuse"]


def test_alike_tpu_blocks_share_one_list_of_choices(config, monkeypatch):
    """Jobs decoded one by one (each spec its own dict) whose `tpu` blocks are alike get one
    list of choices, built once; a block that differs gets its own; a block that is not JSON
    (a spec made by hand) is still read."""
    spec = check(HEAD + FALLBACKS + TAIL, config).spec
    placements(spec)
    built = []
    make = spec_placement._choice
    monkeypatch.setattr(spec_placement, "_choice", lambda *a: built.append(a) or make(*a))
    copy = json.loads(json.dumps(spec))
    assert copy is not spec and placements(copy) is placements(spec)
    assert built == []  # known by its block's text: nothing built again
    other = json.loads(json.dumps(spec))
    other["tpu"]["zone"] = "us-east5-a"
    assert placements(other)[0].zone == "us-east5-a" and placements(spec)[0].zone == "us-central2-b"
    odd = {**spec, "tpu": {**spec["tpu"], "labels": {1, 2}}}  # a set: no JSON for it
    assert placements(odd) == placements(spec)


def test_a_full_cache_of_choices_starts_over_and_still_learns_new_blocks(config, monkeypatch):
    """Past MOST_CACHED distinct `tpu` blocks (a lab's history, or a member's stream of odd
    specs) the block cache starts over: a new block is still learnt, and the cache never
    holds more than its bound."""
    monkeypatch.setattr(spec_placement, "MOST_CACHED", 3)
    monkeypatch.setattr(spec_placement, "_BY_BLOCK", {})
    spec = check(HEAD + FALLBACKS + TAIL, config).spec
    for zone in ("us-east5-a", "us-east5-b", "us-east5-c", "us-central2-b"):
        other = json.loads(json.dumps(spec))
        other["tpu"]["zone"] = zone
        placements(other)
        assert len(spec_placement._BY_BLOCK) <= 3
    built = []
    make = spec_placement._choice
    monkeypatch.setattr(spec_placement, "_choice", lambda *a: built.append(a) or make(*a))
    again = json.loads(json.dumps(spec))
    again["tpu"]["zone"] = "us-central2-b"  # the last block read: known, though the cache was full before it
    assert placements(again)[0].zone == "us-central2-b" and built == []
