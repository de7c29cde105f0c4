"""Hypothesis strategies for schema-valid events of any type."""

from __future__ import annotations

from hypothesis import strategies as st

from ledger.events import EVENT_TYPES, NewEvent, actor

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
small = st.integers(min_value=0, max_value=50)
tpu = st.fixed_dictionaries(
    {"name": st.sampled_from(["tpu-a", "tpu-b"])},
    optional={"zone": st.just("us-central2-b"), "kind": st.sampled_from(["spot", "on-demand"]),
              "accelerator": st.just("v4-32"), "shared": st.booleans()},
)
json_leaf = st.none() | st.booleans() | st.integers(-(2**60), 2**60) | text | st.floats(allow_nan=False, allow_infinity=False)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=8)

DATA = {
    "submitted": st.fixed_dictionaries({
        "spec": st.dictionaries(text, json_value, max_size=3), "spec_hash": st.just("ab12cd34ef56"),
        "commit": st.just("c0ffee"), "path": st.just("jobs/a/b.yaml"),
    }, optional={"author": text, "approvers": st.lists(text, max_size=2)}),
    "rejected": st.fixed_dictionaries({"reason": text.filter(bool)}),
    "spec_updated": st.fixed_dictionaries({"spec": st.dictionaries(text, json_value, max_size=2), "spec_hash": st.just("ff00")}),
    "provisioning": st.fixed_dictionaries({"attempt": small}, optional={"tpu": tpu}),
    "provisioned": st.fixed_dictionaries({}, optional={"tpu": tpu, "hosts": st.lists(st.fixed_dictionaries({"worker": small}), max_size=2)}),
    "provision_failed": st.fixed_dictionaries({"reason": text}, optional={"final": st.booleans()}),
    "setup_failed": st.fixed_dictionaries({}, optional={"module": text, "reason": text, "final": st.booleans()}),
    "failed": st.fixed_dictionaries(
        {"kind": st.sampled_from(["grpc", "exit", "lost_host", "setup", "provision", "budget"])},
        optional={"message": text, "exit_code": st.none() | small, "worker": st.none() | small, "final": st.booleans()},
    ),
    "resumed": st.fixed_dictionaries({"attempt": small, "restarts": small}, optional={"rule": text, "reapply": st.booleans()}),
    "rerun": st.fixed_dictionaries({"attempt": small, "restarts": small}, optional={"rule": text, "reapply": st.booleans()}),
    "released": st.fixed_dictionaries({}, optional={"tpu": tpu, "reason": text}),
    "history_rewritten": st.fixed_dictionaries({"old_head": st.just("aaa"), "new_head": st.just("bbb")}),
    "action_intent": st.fixed_dictionaries({"action_id": st.sampled_from(["a1", "a2"]), "action": st.just("create_tpu")},
                                           optional={"params": st.dictionaries(text, json_value, max_size=2)}),
    "action_outcome": st.fixed_dictionaries({"action_id": st.sampled_from(["a1", "a2"]), "ok": st.just(True)},
                                            optional={"result": json_value}),
}


def data_for(type_: str):
    return DATA.get(type_, st.fixed_dictionaries({}, optional={"reason": text, "text": text}))


@st.composite
def event_batches(draw, max_batches: int = 25):
    """[(stream, [NewEvent, ...]), ...]: job streams and a system stream, any type order
    (illegal transitions included: the fold must record them, never crash)."""
    batches = []
    for _ in range(draw(st.integers(1, max_batches))):
        stream = draw(st.sampled_from(["alice/a", "alice/b", "bob/c", "_system"]))
        events = []
        for _ in range(draw(st.integers(1, 3))):
            type_ = draw(st.sampled_from(EVENT_TYPES))
            events.append(NewEvent(type_, draw(data_for(type_)), actor("cli", draw(text.filter(bool)))))
        batches.append((stream, events))
    return batches
