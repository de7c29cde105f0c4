"""Redaction of a job's secrets from what is collected (pure: bytes in, bytes out)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ledger.spec.redact import Redactor, complete, mask, secret_refs
from reconciler.remote.runner import MAX_FETCH, _collect

KEY = b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU\nAAAAAAAAAAEAAAAzAAAAC3NzaC1lZDI1\n-----END OPENSSH PRIVATE KEY-----\n"


def test_every_line_of_a_secret_is_masked_keeping_the_length():
    out = b"$ cat ~/.ssh/id\n" + KEY + b"and inline: xxAAAAAAAAAAEAAAAzAAAAC3NzaC1lZDI1yy\n"
    red = Redactor([KEY])(out)
    assert len(red) == len(out)
    for line in KEY.splitlines():
        assert line not in red
    assert b"$ cat ~/.ssh/id\n" in red and red.count(b"[redacted") == 5


def test_a_short_one_line_secret_is_masked_whole_and_short_lines_of_a_long_one_are_not():
    assert Redactor([b"tok\n"])(b"the tok is tok") == b"the *** is ***"
    assert Redactor([b"ab\nlong enough line\n"])(b"ab and long enough line") == b"ab and [redacted******]"
    assert not Redactor([]) and Redactor([])(b"x") == b"x"
    assert mask(b"0123456789") == b"[redacted]"


def test_only_keys_and_secret_references_are_secrets():
    spec = {"ssh": {"identities": [{"private_key": "id_deploy", "public_key": "secret://id.pub"}]},
            "venv": {"requirements_file": "envs/req.txt"}, "conda": {"config_file": "secret://env.yml"}}
    assert secret_refs(spec) == ["id_deploy", "secret://id.pub", "secret://env.yml"]


@given(st.binary(max_size=300), st.integers(min_value=0, max_value=300))
def test_a_secret_split_across_fetches_is_never_collected(noise, cut):
    secret = b"SUPER-SECRET-TOKEN-0123456789"
    stream = noise.replace(b"SUPER", b"") + b"\n" + secret + b"\n" + noise.replace(b"SUPER", b"")
    cut = min(cut, len(stream))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "log"
        out.touch()
        redact = Redactor([secret])
        # the probe fetches from the collected size on: what was held back comes again
        for final, chunk_end in ((False, cut), (True, len(stream))):
            _collect(out, stream[out.stat().st_size:chunk_end], redact, final=final)
        collected = out.read_bytes()
    assert secret not in collected and len(collected) == len(stream)


def test_a_line_longer_than_a_fetch_is_collected_as_it_comes(tmp_path):
    out = tmp_path / "log"
    _collect(out, b"x" * MAX_FETCH, Redactor([b"a secret value"]), final=False)
    assert out.stat().st_size == MAX_FETCH
    assert complete(b"a\rb") == 2 and complete(b"ab") == 0
