"""Loading untrusted YAML into plain JSON data, with the position of every node.

Job files come from anyone who can open a pull request, and the watcher must survive all
of them. So the data is built from libyaml's *event stream* (flat, never recursive: a deep
document cannot overflow a C or Python stack, as `yaml.compose` does), with hard budgets:

- size (bytes) and nesting depth, checked before and while parsing;
- alias expansion: every use of an alias adds the size of its anchor to a budget, so a
  "billion laughs" document stops after a few thousand nodes, not after exhausting memory;
- only the YAML core types (str, int, float, bool, null; timestamps stay strings); any
  other tag (`!!python/object`, `!!binary`, `!custom`) is refused, never constructed;
- duplicate keys and non-scalar keys are refused; keys are always strings as written, so
  `on:`/`yes:` keys do not turn into booleans.

Positions are kept per JSON pointer, for values and for keys, so that every later error,
from the schema or a semantic check, points at a line and column.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml import events as ev
from yaml.constructor import SafeConstructor
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

MAX_BYTES = 256 * 1024
MAX_DEPTH = 32
MAX_NODES = 20_000

try:  # libyaml's parser alone: events without the loader's Python layers
    from yaml._yaml import CParser as _Parser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _Parser = yaml.SafeLoader
_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null", "timestamp")}
_MAP_TAGS = {None, "!", _TAG + "map"}
_SEQ_TAGS = {None, "!", _TAG + "seq"}
_MERGE = _TAG + "merge"


@dataclass(frozen=True)
class LoadError(Exception):
    """Why a document could not be loaded; line and column are 1-based (0 = unknown)."""

    message: str
    hint: str
    line: int = 0
    column: int = 0


@dataclass
class Loaded:
    data: Any
    marks: dict[str, Any] = field(default_factory=dict)  # pointer -> yaml Mark of the value
    key_marks: dict[str, Any] = field(default_factory=dict)  # pointer -> yaml Mark of its key

    def position(self, pointer: str, *, key: bool = False) -> tuple[int, int]:
        """The closest known (line, column) for a pointer: its own, else its nearest ancestor's."""
        if key and pointer in self.key_marks:
            return _pos(self.key_marks[pointer])
        p = pointer
        while True:
            if p in self.marks:
                return _pos(self.marks[p])
            if not p:
                return (1, 1)
            p = p.rsplit("/", 1)[0]


def escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _pos(mark: Any) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)


_resolver = Resolver()
_constructor = SafeConstructor()


def _scalar(event: ev.ScalarEvent) -> Any:
    tag = event.tag
    if tag is None or tag == "!":
        tag = _resolver.resolve(ScalarNode, event.value, event.implicit)
    if tag not in _SCALAR_TAGS:
        raise LoadError(
            f"the YAML tag {event.tag or tag!r} is not allowed",
            "job files hold plain data only: remove the tag (strings, numbers, booleans, lists and mappings need none)",
            *_pos(event.start_mark),
        )
    if tag == _TAG + "str" or tag == _TAG + "timestamp":
        return event.value
    node = ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
    try:
        value = _constructor.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError) as exc:
        raise LoadError(
            f"{event.value!r} is not a valid {tag[len(_TAG):]}: {exc}",
            "fix the value, or quote it to make it a string",
            *_pos(event.start_mark),
        ) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise LoadError(
            f"{event.value!r} (NaN or infinity) cannot be stored",
            "use a finite number, or quote it to make it a string",
            *_pos(event.start_mark),
        )
    return value


class _Frame:
    __slots__ = ("value", "is_map", "pointer", "anchor", "key", "key_mark", "merges", "explicit", "size")

    def __init__(self, value: Any, pointer: str, anchor: str | None) -> None:
        self.value = value
        self.is_map = isinstance(value, dict)
        self.pointer = pointer
        self.anchor = anchor
        self.key: str | None = None  # mapping: the key awaiting its value
        self.key_mark: Any = None
        self.merges: list[tuple[Any, Any]] = []
        self.explicit: set[str] = set()
        self.size = 1


def load(text: bytes | str) -> Loaded:
    """Parse one YAML document into JSON-compatible data; raise LoadError on anything unsafe."""
    if isinstance(text, bytes):
        if len(text) > MAX_BYTES:
            raise LoadError(
                f"file is {len(text):,} bytes, over the {MAX_BYTES // 1024} KiB limit",
                "a job spec is a few kilobytes: move large scripts into your code repository and call them from `command.cmd`",
            )
        if text.startswith(b"\xef\xbb\xbf"):
            text = text[3:]
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = text.count(b"\n", 0, exc.start) + 1
            column = exc.start - (text.rfind(b"\n", 0, exc.start) + 1) + 1
            raise LoadError(
                f"file is not valid UTF-8 (byte 0x{text[exc.start]:02x} at offset {exc.start})",
                "save the file as UTF-8",
                line,
                column,
            ) from None
    elif len(text) > MAX_BYTES and len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise LoadError(
            f"file is over the {MAX_BYTES // 1024} KiB limit",
            "a job spec is a few kilobytes: move large scripts into your code repository",
        )
    return _build(text)


_SCALAR_EV = ev.ScalarEvent
_ALIAS_EV = ev.AliasEvent
_MAP_START, _SEQ_START = ev.MappingStartEvent, ev.SequenceStartEvent
_MAP_END, _SEQ_END = ev.MappingEndEvent, ev.SequenceEndEvent
_DOC_START = ev.DocumentStartEvent
_STREAM_END = ev.StreamEndEvent

# Plain scalars repeat across files (zones, accelerators, true, 0): their values are
# immutable, so each spelling is resolved and constructed once.
_plain_cache: dict[str, Any] = {}
_PLAIN_CACHE_MAX = 50_000


def _plain(event: ev.ScalarEvent) -> Any:
    if event.tag is None and event.implicit[0]:
        try:
            return _plain_cache[event.value]
        except KeyError:
            value = _scalar(event)
            if len(_plain_cache) >= _PLAIN_CACHE_MAX:
                _plain_cache.clear()
            _plain_cache[event.value] = value
            return value
    if event.tag is None:  # quoted: always a string
        return event.value
    return _scalar(event)


def _too_many(aliases_used: bool, mark: Any) -> LoadError:
    if aliases_used:
        return LoadError(
            f"aliases expand to more than {MAX_NODES:,} values (an alias bomb?)",
            "write the values out, or use fewer and smaller anchors",
            *_pos(mark),
        )
    return LoadError(
        f"document has more than {MAX_NODES:,} values",
        "a job spec is small: move data into files that your command reads",
        *_pos(mark),
    )


def _build(text: str) -> Loaded:
    marks: dict[str, Any] = {}
    key_marks: dict[str, Any] = {}
    stack: list[_Frame] = []
    anchors: dict[str, tuple[Any, int]] = {}
    budget = MAX_NODES
    aliases_used = False
    documents = 0
    root: Any = None
    have_root = False

    parser = _Parser(text)
    get_event = parser.get_event
    try:
        while True:
            event = get_event()
            t = type(event)
            if t is _STREAM_END or event is None:
                break
            frame = stack[-1] if stack else None
            if t is _MAP_END or t is _SEQ_END:
                done = stack.pop()
                if done.merges:
                    _apply_merges(done)
                if stack:
                    stack[-1].size += done.size
                if done.anchor:
                    anchors[done.anchor] = (done.value, done.size)
                continue
            if frame is not None and frame.is_map and frame.key is None:
                if t is not _SCALAR_EV:
                    raise LoadError(
                        "mapping keys must be plain strings",
                        "write the key as a plain word, e.g. `name:`",
                        *_pos(event.start_mark),
                    )
                key = event.value
                if key == "<<" and event.style is None and event.tag in (None, _MERGE):
                    frame.key, frame.key_mark = "<<", event.start_mark
                    continue
                if key in frame.explicit:
                    raise LoadError(
                        f"duplicate key {key!r}",
                        "each key may appear once in a mapping: remove or merge the repeated one",
                        *_pos(event.start_mark),
                    )
                frame.explicit.add(key)
                frame.key, frame.key_mark = key, event.start_mark
                continue
            if t is _SCALAR_EV:
                size = 1
                value = _plain(event)
                if event.anchor:
                    anchors[event.anchor] = (value, 1)
            elif t is _MAP_START or t is _SEQ_START:
                size = 0  # counted when it ends
                if event.tag not in (_MAP_TAGS if t is _MAP_START else _SEQ_TAGS):
                    raise LoadError(
                        f"the YAML tag {event.tag!r} is not allowed",
                        "job files hold plain data only: remove the tag",
                        *_pos(event.start_mark),
                    )
                if len(stack) >= MAX_DEPTH:
                    raise LoadError(
                        f"nesting deeper than {MAX_DEPTH} levels",
                        "a job spec is shallow: flatten the structure",
                        *_pos(event.start_mark),
                    )
                value = {} if t is _MAP_START else []
            elif t is _ALIAS_EV:
                aliases_used = True
                if event.anchor not in anchors:
                    raise LoadError(
                        f"alias *{event.anchor} refers to an unknown or unfinished anchor",
                        "define `&name` before using `*name`, and not inside itself",
                        *_pos(event.start_mark),
                    )
                value, size = anchors[event.anchor]
                budget -= size - 1
                if budget < 0:
                    raise _too_many(True, event.start_mark)
                if size > 1:
                    value = copy.deepcopy(value)
            elif t is _DOC_START:
                documents += 1
                if documents > 1:
                    raise LoadError(
                        "file holds more than one YAML document",
                        "keep one job per file: remove the `---` separator and what follows",
                        *_pos(event.start_mark),
                    )
                continue
            else:  # stream start/end, document end
                continue
            budget -= 1
            if budget < 0:
                raise _too_many(aliases_used, event.start_mark)
            # Attach the value to its parent (or make it the root) under its pointer.
            mark = event.start_mark
            if frame is None:
                root, have_root = value, True
                pointer: str | None = ""
                marks[""] = mark
            elif frame.is_map:
                key = frame.key
                frame.key = None
                frame.size += size
                if key == "<<":
                    frame.merges.append((value, mark))
                    pointer = None
                else:
                    pointer = f"{frame.pointer}/{escape(key)}" if ("/" in key or "~" in key) else f"{frame.pointer}/{key}"
                    frame.value[key] = value
                    marks[pointer] = mark
                    key_marks[pointer] = frame.key_mark
            else:
                frame.size += size
                pointer = f"{frame.pointer}/{len(frame.value)}"
                frame.value.append(value)
                marks[pointer] = mark
            if size == 0:
                child = _Frame(value, pointer if pointer is not None else "\x00merge", event.anchor)
                stack.append(child)
    except LoadError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise LoadError(
            f"not valid YAML: {exc.problem or exc.context}",
            "check indentation, colons and quotes near this position",
            *_pos(mark),
        ) from None
    except yaml.YAMLError as exc:
        raise LoadError(f"not valid YAML: {exc}", "check the file's characters and structure") from None
    except RecursionError:
        raise LoadError(f"nesting deeper than {MAX_DEPTH} levels", "flatten the structure") from None
    finally:
        dispose = getattr(parser, "dispose", None)
        if dispose is not None:
            dispose()
    if not have_root or root is None:
        raise LoadError("file is empty", "write a job spec: see jobs/examples/ in the jobs repository", 1, 1)
    return Loaded(root, marks, key_marks)


def _apply_merges(frame: _Frame) -> None:
    """YAML merge keys (`<<: *base`): keys written in the mapping win over merged ones."""
    target: dict = frame.value
    for value, mark in frame.merges:
        sources = value if isinstance(value, list) else [value]
        for source in sources:
            if not isinstance(source, dict):
                raise LoadError(
                    "`<<` merges mappings only",
                    "give `<<` an alias of a mapping, or a list of such aliases",
                    *_pos(mark),
                )
            for k, v in source.items():
                if k not in target:
                    target[k] = copy.deepcopy(v)
