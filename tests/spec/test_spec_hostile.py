"""Hostile input: every case is refused with a message, never an exception or a crash.

"Never an exception" is checked where it counts: `validate_text` turns an unexpected exception
into an "internal error while validating" finding (so the watcher survives a bug), which would
satisfy "ok or some error". The fuzz tests therefore assert that no finding is an internal error.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.spec.names import SHELL_META, job_id_from_path, safe_stream
from ledger.spec.normalize import validate_text
from ledger.spec.yamlsafe import MAX_BYTES, MAX_DEPTH

VALID = "tpu: {accelerator: v4-8, zone: us-central2-b}\ncommand: {cmd: python train.py}\n"


def sound(result):
    """A verdict the validator meant: ok xor errors, and no finding from an unexpected exception."""
    internal = [m.format() for m in result.errors + result.warnings if "internal error" in m.message]
    assert not internal, internal
    assert (result.spec is None) == bool(result.errors)
    for m in result.errors:
        assert m.message and m.hint is not None and m.line >= 0
    return result


def only_error(result):
    sound(result)
    assert not result.ok and result.spec is None
    return result.errors[0]


def test_oversized_file_is_refused_before_parsing(config):
    text = VALID.encode() + b"# " + b"x" * MAX_BYTES + b"\n"
    m = only_error(validate_text(text, "jobs/alice/big.yaml", config))
    assert "over the 256 KiB limit" in m.message and "command.cmd" in m.hint


def test_non_utf8_is_refused_with_its_position(config):
    text = VALID.encode() + b"notes: caf\xe9\n"
    m = only_error(validate_text(text, "jobs/alice/latin1.yaml", config))
    assert "not valid UTF-8" in m.message and "0xe9" in m.message
    assert (m.line, m.column) == (3, 11)
    assert m.hint == "save the file as UTF-8"


def test_utf8_bom_and_non_ascii_values_are_fine(config):
    text = "\ufeffjob: {notes: 'Ünïcödé 中文 ok'}\n".encode() + VALID.encode()
    result = validate_text(text, "jobs/alice/bom.yaml", config)
    assert result.ok, [m.format() for m in result.errors]
    assert result.spec["job"]["notes"] == "Ünïcödé 中文 ok"


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 200_000])
def test_deep_flow_nesting_is_refused_without_recursion(depth, config):
    # 200,000 levels crash libyaml's recursive composer (yaml.compose) with a segfault.
    text = "tpu: " + "[" * depth + "]" * depth + "\n"
    m = only_error(validate_text(text[: MAX_BYTES - 1], "jobs/alice/deep.yaml", config))
    assert f"nesting deeper than {MAX_DEPTH} levels" in m.message or "not valid YAML" in m.message
    assert m.line == 1


def test_deep_block_nesting_is_refused(config):
    lines = [" " * i + f"k{i}:" for i in range(MAX_DEPTH + 5)]
    m = only_error(validate_text("\n".join(lines) + " 1\n", "jobs/alice/deep.yaml", config))
    assert f"nesting deeper than {MAX_DEPTH} levels" in m.message
    assert m.line == MAX_DEPTH + 1


def test_alias_bomb_stops_early(config):
    layers = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 12):
        layers.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]")
    m = only_error(validate_text("\n".join(layers) + "\n", "jobs/alice/lol.yaml", config))
    assert "alias bomb" in m.message


def test_many_plain_values_are_bounded(config):
    text = "args: [" + ",".join("1" for _ in range(30_000)) + "]\n"
    m = only_error(validate_text(text, "jobs/alice/many.yaml", config))
    assert "more than 20,000 values" in m.message


@pytest.mark.parametrize(
    "text, needle",
    [
        ("tpu: !!binary aGVsbG8=\n", "tag:yaml.org,2002:binary"),
        ("tpu: !!set {a, b}\n", "tag:yaml.org,2002:set"),
        ("tpu: !!python/name:os.system\n", "python/name:os.system"),
        ("a: \x00\n", "not valid YAML"),
        ("a: [1, 2\n", "not valid YAML"),
        ("a: 'unterminated\n", "not valid YAML"),
        ("\t- a\n", "not valid YAML"),
        ("key: value\n  bad indent: 1\n", "not valid YAML"),
        ("a: *nowhere\n", "unknown or unfinished anchor"),
        ("<<: 5\n", "`<<` merges mappings only"),
        ("", "file is empty"),
        ("~\n", "file is empty"),
    ],
)
def test_malformed_yaml_gives_a_message(text, needle, config):
    m = only_error(validate_text(text, "jobs/alice/bad.yaml", config))
    assert needle in m.message, m.format()
    assert m.hint


def test_merge_keys_work_and_written_keys_win(config):
    text = (
        "x-base: &base {accelerator: v4-8, zone: us-central1-a}\n"
        "tpu:\n  <<: *base\n  zone: us-central2-b\ncommand: {cmd: go}\n"
    )
    result = validate_text(text, "jobs/alice/merge.yaml", config)
    # `x-base` is not a job field: refused, but the merge itself was understood.
    assert [m.pointer for m in result.errors] == ["/x-base"]
    inline = "tpu:\n  <<: {accelerator: v4-8, zone: us-central1-a}\n  zone: us-central2-b\ncommand: {cmd: go}\n"
    result = validate_text(inline, "jobs/alice/merge.yaml", config)
    assert result.ok, [m.format() for m in result.errors]
    assert (result.spec["tpu"]["accelerator"], result.spec["tpu"]["zone"]) == ("v4-8", "us-central2-b")


def test_yaml_11_booleans_in_keys_stay_strings(config):
    text = VALID + "command: {cmd: go}\n"
    assert "duplicate key 'command'" in only_error(validate_text(text, "jobs/alice/x.yaml", config)).message
    result = validate_text(VALID + "args: {on: 1, yes: 2}\n", "jobs/alice/x.yaml", config)
    assert [m.pointer for m in result.errors] == ["/args/on", "/args/yes"]  # keys stay "on"/"yes", not True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400))
def test_random_bytes_never_raise(config, data):
    sound(validate_text(data, "jobs/alice/fuzz.yaml", config))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(min_value=0, max_value=2**32), st.integers(min_value=1, max_value=8))
def test_mutated_valid_specs_never_raise(config, seed, edits):
    rng = random.Random(seed)
    chars = list(VALID + "recovery: {rule: pre, max_restarts: 3}\nargs: {lr: 0.1}\n")
    alphabet = ":{}[]-,&*!|>'\"#\n 0123456789abcv${}."
    for _ in range(edits):
        i = rng.randrange(len(chars))
        op = rng.randrange(3)
        if op == 0:
            chars[i] = rng.choice(alphabet)
        elif op == 1:
            chars.insert(i, rng.choice(alphabet))
        else:
            del chars[i]
    sound(validate_text("".join(chars), "jobs/alice/fuzz.yaml", config))


def test_sound_rejects_an_internal_error(config, monkeypatch):
    """The fuzz tests' check can fail: a validator bug surfaces as an internal error finding."""
    import ledger.spec.normalize as normalize

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(normalize, "_command", broken)
    result = validate_text(VALID, "jobs/alice/bug.yaml", config)
    assert not result.ok
    with pytest.raises(AssertionError, match="internal error while validating: KeyError"):
        sound(result)


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(blacklist_characters="/\x00") | st.integers(0xDC80, 0xDCFF).map(chr), min_size=1, max_size=40))
def test_any_file_name_gets_a_printable_verdict(name):
    """Whatever a file is called (control characters, surrogate escapes of bytes that were not
    UTF-8, shell metacharacters), the verdict is a job id or one printable line saying why."""
    job_id, problem, hint = job_id_from_path(f"jobs/alice/{name}.yaml")
    if job_id is not None:
        assert problem is None and safe_stream(job_id)
        return
    assert problem.isprintable() and hint.isprintable(), (problem, hint)
    if any(0xDC80 <= ord(c) <= 0xDCFF for c in name):
        assert "not valid UTF-8" in problem
    elif any(not c.isprintable() and c != " " for c in name):
        assert "control characters" in problem
    elif any(c in SHELL_META for c in name):
        assert "shell metacharacters" in problem
