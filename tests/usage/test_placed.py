"""What a job takes is what was placed (ledger.placement): usage, prices and admission charge
the choice the job got and every slice of it, not its first choice."""

from __future__ import annotations

from ledger.fold import JobState, initial, replay
from ledger.placement import footprint, slice_nodes, takes
from ledger.spec.placement import choice
from ledger.usage import UsageFold, summarize, to_us
from reconciler.admission import need_of

SPEC = {"tpu": {"accelerator": "v4-32", "zone": "us-central2-b", "pricing": "spot", "chips": 16, "hosts": 4,
                "fallbacks": [{"accelerator": "v5litepod-16", "zone": "us-west4-a", "pricing": "spot", "slices": 2,
                               "allocation_mode": "queued-resources", "version": "v2-alpha-tpuv5-lite"}]}}
PLACED = {"name": "tl-q", "zone": "us-west4-a", "accelerator": "v5litepod-16", "pricing": "ondemand", "slices": 2, "placement": 1}


def test_footprint_counts_every_slice():
    one, two = footprint("v5litepod-16"), footprint("v5litepod-16", 2)
    assert (one.chips, one.hosts, two.chips, two.hosts, two.chips_per_slice, two.hosts_per_slice) == (16, 4, 32, 8, 16, 4)
    assert footprint("v9-8") is None and footprint("v4-8", "2") == footprint("v4-8")  # a hand-written event's junk
    assert slice_nodes(PLACED) == ["tl-q-0", "tl-q-1"] and slice_nodes({"name": "n"}) == ["n"]
    assert footprint(["not", "a", "name"]) is None  # unhashable junk: no type, no error


def test_each_type_and_slices_is_one_object_with_its_need_the_one_cache_of_types():
    assert footprint("v4-32", 2) is footprint("v4-32", 2)
    assert footprint("v4-32", 2).need == ("v4", 32) and footprint("v4-32", 2).need.family == "v4"
    job = JobState(id="alice/j", spec=SPEC)
    assert need_of(job) is footprint("v4-32").need  # admission's count is the table's own, not a copy


def test_a_waiting_job_takes_the_choice_it_asks_for_and_a_holding_one_what_was_placed():
    job = JobState(id="alice/j", spec=SPEC)
    assert (takes(job).chips, takes(job, 1).chips, takes(job, 1).family) == (16, 32, "v5litepod")
    assert need_of(job).chips == 16 and need_of(job, choice(SPEC, 1)).chips == 32
    holding = JobState(id="alice/j", spec=SPEC, tpu=PLACED)
    assert need_of(holding).chips == 32 and need_of(holding, choice(SPEC, 0)).chips == 32  # what it holds, whatever it asks


def test_usage_charges_the_placed_type_pricing_and_slices():
    t = ["2026-01-01T10:00:00Z", "2026-01-01T10:10:00Z", "2026-01-01T11:10:00Z"]
    rows = [
        (1, "alice/j", 1, "submitted", t[0], {"spec": SPEC}),
        (2, "alice/j", 2, "provisioning", t[1], {"attempt": 1, "tpu": PLACED}),
        (3, "alice/j", 3, "released", t[2], {"tpu": PLACED}),
    ]
    fold = UsageFold().apply_rows(rows, decoded=True)
    keys = {k.accelerator: (k.zone, k.pricing) for k in fold.figures(to_us(t[2]))}
    assert keys == {"v4-32": ("us-central2-b", "spot"), "v5litepod-16": ("us-west4-a", "ondemand")}
    report = summarize(fold.figures(to_us(t[2])), "accelerator")
    chip_hours = {r.group: r.chip_us for r in report.rows}
    assert chip_hours["v5litepod-16"][1] == 32 * 60 * 60_000_000  # provisioning, an hour, 2 x 16 chips
    assert chip_hours["v4-32"][0] == 16 * 10 * 60_000_000  # waiting 10 min for its first choice


def test_old_tpus_without_placement_fields_are_one_slice_of_choice_zero():
    state = replay([])
    job = initial("alice/old")
    job.tpu = {"name": "n", "accelerator": "v4-8"}
    assert takes(job).chips == 4 and state.jobs == {}
