"""Hypothesis strategies for valid events of any type, drawn from the event classes themselves
(ledger/events/data.py): every field, every Literal value, every constraint they declare."""

from __future__ import annotations

import functools

import msgspec
from hypothesis import strategies as st
from msgspec import inspect as mi

from ledger.events import DATA_TYPES, EVENT_TYPES, NewEvent, actor

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
json_leaf = st.none() | st.booleans() | st.integers(-(2**60), 2**60) | text | st.floats(allow_nan=False, allow_infinity=False)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=8)


def of_type(t: mi.Type) -> st.SearchStrategy:
    """Values of one msgspec type (as `msgspec.inspect` describes it), within its constraints."""
    if isinstance(t, mi.Metadata):  # a description around the type
        return of_type(t.type)
    if isinstance(t, mi.StructType):
        required = {f.name: of_type(f.type) for f in t.fields if f.required}
        optional = {f.name: of_type(f.type) for f in t.fields if not f.required}
        return st.fixed_dictionaries(required, optional=optional)
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.StrType):
        if t.pattern:
            return st.from_regex(t.pattern, fullmatch=True)
        return st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=t.min_length or 0, max_size=12)
    if isinstance(t, mi.IntType):
        return st.integers(t.ge if t.ge is not None else -(2**40), 2**40)
    if isinstance(t, mi.FloatType):
        return st.floats(t.ge if t.ge is not None else -1e12, 1e12, allow_nan=False, allow_infinity=False)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.AnyType):
        return json_value
    if isinstance(t, mi.ListType):
        return st.lists(of_type(t.item_type), max_size=3)
    if isinstance(t, mi.DictType):
        return st.dictionaries(of_type(t.key_type), of_type(t.value_type), max_size=3)
    if isinstance(t, mi.UnionType):
        return st.one_of(*(of_type(sub) for sub in t.types))
    raise TypeError(f"no strategy for {t}")


def _fits(cls: type, value: dict) -> bool:
    try:
        msgspec.convert(value, cls)  # rules beyond the fields' types (ActionOutcome's error)
    except msgspec.ValidationError:
        return False
    return True


@functools.cache
def data_for(type_: str) -> st.SearchStrategy:
    """Valid `data` of one event type, as a writer could give it."""
    cls = DATA_TYPES[type_]
    return of_type(mi.type_info(cls)).filter(functools.partial(_fits, cls))


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
