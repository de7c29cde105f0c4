"""A writer cannot produce what verify rejects.

Every place in the product that appends an event is found by reading the source (an AST
scan): each one builds its data from the event classes (ledger/events/data.py). And every
value those classes let a writer give, every Literal value included (the failure kinds
among them), is encoded by `NewEvent` into an event that verify's check accepts.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from msgspec import inspect as mi

from ledger.describe import summarize
from ledger.events import (
    DATA_TYPES,
    EVENT_TYPES,
    GENESIS_HASH,
    READ_TYPES,
    EventDataError,
    NewEvent,
    random_id,
    seal,
)
from ledger.events.schema import RowChecker

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = sorted(p for d in ("ledger", "reconciler", "emulator") for p in (ROOT / d).rglob("*.py"))
CLASSES = {cls.__name__: cls for cls in DATA_TYPES.values()}

# Where the product appends events (NewEvent constructions), per file. A new append site
# changes a count here: make its data a class from ledger/events/data.py, then update it.
APPEND_SITES = {
    "ledger/app/commands/overrides.py": 1,  # the overrides: cancel, resume, rerun, admit
    "ledger/app/queueview.py": 1,  # policy_applied: the sharing policy a reconciler enforces
    "ledger/gitops/decide.py": 2,  # submitted, spec_updated, rejected, cancel_requested; policy_changed
    "ledger/gitops/ingest.py": 5,  # rewrite_accepted, history_rewritten, the `ingested` note, quarantined + its note
    "reconciler/executor.py": 7,  # intents, outcomes, what effects and the planner decided
    "reconciler/loop.py": 1,  # api_unreachable, api_reachable: a zone's TPU API down and back (`_cloud`)
    "reconciler/doctor/records.py": 2,  # the host checks' repairs: clean intent, clean outcome
}
# Names an append site may pass as data, each bound to a class instance (see the site).
TYPED_NAMES = {
    ("ledger/app/commands/overrides.py", "data"),  # Callable[[JobState, str, OverrideSignature | None], EventData]
    ("ledger/app/queueview.py", "data"),  # PolicyApplied(...)
    ("ledger/gitops/decide.py", "data"),  # emit(..., data: EventData, ...)
    ("ledger/gitops/ingest.py", "data"),  # HistoryRewritten(...)
    ("reconciler/executor.py", "d"),  # an element of Events = list[EventData]
    ("reconciler/executor.py", "outcome"),  # ActionOutcome(...)
    ("reconciler/executor.py", "released"),  # Released(...)
    ("reconciler/loop.py", "data"),  # ApiUnreachable(...) or ApiReachable(...)
    ("reconciler/doctor/records.py", "intent"),  # ActionIntent(...)
    ("reconciler/doctor/records.py", "outcome"),  # ActionOutcome(...)
}


def _class_named(node: ast.AST) -> str | None:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name if name in CLASSES else None


def _scan(sources: list[tuple[str, str]] | None = None) -> tuple[Counter, list[str], set[str]]:
    """(append sites per file, sites whose data is not typed, data classes referenced)."""
    if sources is None:
        sources = [(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")) for p in PRODUCT]
    sites: Counter = Counter()
    untyped: list[str] = []
    referenced: set[str] = set()
    for rel, source in sources:
        for node in ast.walk(ast.parse(source)):
            if (name := _class_named(node)) is not None and isinstance(getattr(node, "ctx", None), ast.Load):
                referenced.add(name)
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "NewEvent"):
                continue
            sites[rel] += 1
            data = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "data"), None)
            typed = (
                data is not None and (
                    isinstance(data, ast.Call) and (_class_named(data.func) or (rel, getattr(data.func, "id", "")) in TYPED_NAMES)
                    or isinstance(data, ast.Name) and (rel, data.id) in TYPED_NAMES
                )
            )
            if not typed:
                untyped.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:100]}")
    return sites, untyped, referenced


def test_the_scan_sees_untyped_data():
    _, untyped, _ = _scan([("ledger/x.py", 'NewEvent("note", {"text": "x"})\nNewEvent(type="queued", data=dict(reason="r"))\n'
                                           'NewEvent("queued", Queued(reason="r"))\nNewEvent("note")')])
    assert [u.split(":")[1] for u in untyped] == ["1", "2", "4"]


def test_every_append_site_builds_typed_data():
    sites, untyped, _ = _scan()
    assert untyped == [], "data not built from ledger/events/data.py classes:\n" + "\n".join(untyped)
    assert dict(sites) == APPEND_SITES


def _typed_builders(rel: str) -> set[str]:
    """Functions of a module whose return annotation is an event data class."""
    tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
    return {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.returns is not None
            and _class_named(f.returns)}


def test_the_planner_records_only_typed_data():
    tree = ast.parse((ROOT / "reconciler" / "plan.py").read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "_record"]
    assert len(calls) >= 10
    # admission.queued(...) / admission.preemption(...) / slices.lost_event(...): builders
    # annotated to return a data class
    builders = {f"{module}.{name}" for module in ("admission", "slices")
                for name in _typed_builders(f"reconciler/{module}.py")}
    # *react.refused(...) / *react.lost_create(...): what an API answer means, as `Events`
    reacts = {f"react.{f.name}" for f in ast.walk(ast.parse((ROOT / "reconciler" / "react.py").read_text(encoding="utf-8")))
              if isinstance(f, ast.FunctionDef) and f.returns is not None and ast.unparse(f.returns) == "Events"}
    for call in calls:
        assert all(isinstance(a, ast.Call) and (_class_named(a.func) or ast.unparse(a.func) in builders)
                   or isinstance(a, ast.Starred) and isinstance(a.value, ast.Call) and ast.unparse(a.value.func) in reacts
                   for a in call.args[1:]), ast.unparse(call)


def test_the_product_writes_every_event_type_and_each_is_known():
    _, _, referenced = _scan()
    assert {CLASSES[n].event_type for n in referenced} == set(EVENT_TYPES)


# -- every value the classes allow --------------------------------------------------------
_SAMPLE_STR = {"^[0-9a-f]{8,128}$": "ab" * 32}


def _minimal(t: mi.Type) -> Any:
    """The smallest valid value of a type: required fields only."""
    if isinstance(t, mi.Metadata):
        return _minimal(t.type)
    if isinstance(t, mi.StructType):
        return {f.name: _minimal(f.type) for f in t.fields if f.required}
    if isinstance(t, mi.LiteralType):
        return t.values[0]
    if isinstance(t, mi.StrType):
        return _SAMPLE_STR.get(t.pattern or "", "x")
    if isinstance(t, mi.IntType):
        return t.ge if t.ge is not None else 1
    if isinstance(t, mi.FloatType):
        return t.ge if t.ge is not None else 1.5
    if isinstance(t, mi.BoolType):
        return True
    if isinstance(t, mi.ListType):
        return []
    if isinstance(t, mi.DictType):
        return {}
    if isinstance(t, mi.UnionType):
        return _minimal(t.types[0])
    return None


def _literal_paths(t: mi.Type, path: tuple = ()) -> list[tuple[tuple, tuple]]:
    """(path, values) of every Literal reachable from `t`."""
    if isinstance(t, mi.Metadata):
        return _literal_paths(t.type, path)
    if isinstance(t, mi.LiteralType):
        return [(path, t.values)]
    if isinstance(t, mi.StructType):
        return [found for f in t.fields for found in _literal_paths(f.type, (*path, f.name))]
    if isinstance(t, mi.ListType):
        return _literal_paths(t.item_type, (*path, 0))
    if isinstance(t, mi.DictType):
        return _literal_paths(t.value_type, (*path, "k"))
    if isinstance(t, mi.UnionType):
        return [found for sub in t.types for found in _literal_paths(sub, path)]
    return []


def _with(t: mi.Type, path: tuple, value: Any) -> Any:
    """A minimal value of type `t` holding `value` at `path` (containers made as needed)."""
    if not path:
        return value
    while isinstance(t, mi.Metadata | mi.UnionType):  # the member the path goes into
        t = t.type if isinstance(t, mi.Metadata) else next(
            s for s in t.types if isinstance(s, mi.StructType | mi.ListType | mi.DictType | mi.Metadata))
    key, rest = path[0], path[1:]
    if isinstance(t, mi.StructType):
        return {**_minimal(t), key: _with(next(f.type for f in t.fields if f.name == key), rest, value)}
    if isinstance(t, mi.ListType):
        return [_with(t.item_type, rest, value)]
    return {key: _with(t.value_type, rest, value)}


def _cases() -> list[tuple[str, dict]]:
    cases = []
    for type_, cls in DATA_TYPES.items():
        info = mi.type_info(cls)
        cases.append((type_, _minimal(info)))
        for path, values in _literal_paths(info):
            cases += [(type_, _with(info, path, v)) for v in values if (type_, _with(info, path, v)) not in cases]
    return cases


CASES = _cases()


def _accepted_by_verify(type_: str, new: NewEvent) -> str | None:
    event = seal(new, seq=1, stream="alice/a", version=1, prev_hash=GENESIS_HASH, event_id_=random_id("alice/a"))
    return RowChecker().check(event.row())


def test_the_cases_cover_every_literal_value_of_every_class():
    assert {t for t, _ in CASES} == set(EVENT_TYPES)
    failure_kinds = {d["kind"] for t, d in CASES if t == "failed" and "kind" in d}
    assert {"exit", "grpc", "lost_host", "failure", "setup", "preempted", "provision"} <= failure_kinds


@pytest.mark.parametrize(("type_", "data"), CASES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(CASES)])
def test_every_value_a_writer_can_give_is_one_verify_accepts(type_, data):
    new = NewEvent(type_, data)  # refused here if the classes disagreed with themselves
    assert _accepted_by_verify(type_, new) is None, (type_, data)
    assert isinstance(summarize(type_, new.data), str)
    typed = NewEvent(type_, msgspec.convert(data, DATA_TYPES[type_]))  # as the product writes: an instance
    assert typed.data == new.data


def test_what_only_older_versions_wrote_is_read_but_never_written():
    def pairs(cls: type) -> set[tuple[tuple, Any]]:
        return {(p, v) for p, values in _literal_paths(mi.type_info(cls)) for v in values}

    legacy = [(t, p, v) for t, cls in READ_TYPES.items() for p, v in sorted(pairs(cls) - pairs(DATA_TYPES[t]), key=str)]
    assert {v for _, _, v in legacy} == {"pass", "exhausted", "budget"}
    for type_, path, value in legacy:
        data = _with(mi.type_info(READ_TYPES[type_]), path, value)
        with pytest.raises(EventDataError):
            NewEvent(type_, data)
        row = (1, "alice/a", 1, type_, "2026-01-01T00:00:00.000000Z", '{"kind":"system","name":"x"}', random_id(), None,
               json.dumps(data), GENESIS_HASH, "a" * 64)
        assert RowChecker().check(row) is None
