"""How much of a log is collected: per file and per job, the cut said in one line."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reconciler.joblogs.bounds import Limits, Shipment, marker, next_shipment

LIMITS = Limits(file_bytes=100, job_bytes=250, chunk_bytes=40)


def test_new_bytes_are_collected_in_chunks_from_the_collected_size():
    assert next_shipment(30, 0, 0, LIMITS) == Shipment(0, 30, cut=False)
    assert next_shipment(90, 30, 30, LIMITS) == Shipment(30, 70, cut=False)
    assert next_shipment(30, 30, 30, LIMITS) is None  # nothing new


def test_a_file_past_its_bound_is_cut_once_with_the_marker():
    assert next_shipment(500, 80, 80, LIMITS) == Shipment(80, 100, cut=True)
    assert next_shipment(101, 100, 100, LIMITS) == Shipment(100, 100, cut=True)  # exactly full, then more
    assert next_shipment(100, 100, 100, LIMITS) is None  # exactly full: no cut yet
    cut = 100 + len(marker(LIMITS))
    assert next_shipment(10_000, cut, cut, LIMITS) is None  # cut already: never more


def test_a_job_past_its_bound_gets_nothing_more_in_any_file():
    assert next_shipment(100, 0, 230, LIMITS) == Shipment(0, 20, cut=True)
    assert next_shipment(100, 0, 250 + len(marker(LIMITS)), LIMITS) is None


@given(st.lists(st.integers(1, 120), min_size=1, max_size=30))
def test_whatever_grows_the_collected_copies_stay_within_the_bounds(growth):
    """Files of one job grow one after another; the collector runs after each growth."""
    local: dict[int, int] = {}
    stored: dict[int, int] = {}
    for step, size in enumerate(growth):
        f = step % 4
        local[f] = local.get(f, 0) + size
        while (s := next_shipment(local[f], stored.get(f, 0), sum(stored.values()), LIMITS)) is not None:
            assert s.start == stored.get(f, 0) and s.end <= local[f]
            stored[f] = s.end + (len(marker(LIMITS)) if s.cut else 0)
    extra = len(marker(LIMITS))
    assert all(v <= LIMITS.file_bytes + extra for v in stored.values())
    assert sum(stored.values()) <= LIMITS.job_bytes + extra
    assert all(stored.get(f, 0) == v for f, v in local.items() if v <= LIMITS.file_bytes) or \
        sum(stored.values()) >= LIMITS.job_bytes
