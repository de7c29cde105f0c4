"""The reconciler's key and every file outside the owner's secrets folder stay home: refused
when a spec is validated (file:line) and again when the reconciler reads (SecretsDir.read).

Each way a spec could name the reconciler's key is tried: by absolute path, by a relative
path (which once resolved against the reconciler's working directory), with `..`, through a
symbolic link in the owner's folder, and as a reference that interpolation builds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ledger.spec.config import load_repo_config
from ledger.spec.normalize import validate_text
from ledger.spec.secrets import SecretError, SecretsDir, reference_problem

KEY_BYTES = b"-----BEGIN OPENSSH PRIVATE KEY-----\nRECONCILER\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SecretsDir:
    """A ledger host: the reconciler's key in its data dir, alice's and bob's secrets."""
    key = tmp_path / "data" / "ssh" / "id_ecdsa"
    key.parent.mkdir(parents=True)
    key.write_bytes(KEY_BYTES)
    root = tmp_path / "secrets"
    (root / "alice").mkdir(parents=True)
    (root / "bob").mkdir(parents=True)
    (root / "alice" / "id_deploy").write_text("ALICE DEPLOY KEY\n")
    (root / "bob" / "id_bob").write_text("BOB KEY\n")
    monkeypatch.setenv("LEDGER_SSH_KEY", str(key))
    monkeypatch.setenv("LEDGER_SECRETS_DIR", str(root))
    monkeypatch.chdir(key.parent.parent)  # the reconciler's working dir: relative paths once resolved here
    return SecretsDir(root, key)


def spec_text(private_key: str, extra: str = "") -> str:
    return (
        "tpu: {accelerator: v4-8, zone: us-central2-b}\n"
        f"ssh:\n  identities:\n    - private_key: {private_key!r}\n"
        "setup: {modules: [ssh, command]}\n"
        f"command:\n  cmd: cat ~/.ssh/*\n{extra}"
    )


def errors(text: str, host: SecretsDir, path: str = "jobs/alice/steal.yaml"):
    res = validate_text(text, path, load_repo_config(), secrets=host.problem)
    return res, [m for m in res.errors]


def key_path(host: SecretsDir) -> str:
    assert host.reconciler_key is not None
    return str(host.reconciler_key)


def test_the_reconcilers_key_by_absolute_path_is_refused_at_its_line(host):
    res, errs = errors(spec_text(key_path(host)), host)
    assert not res.ok and len(errs) == 1
    m = errs[0]
    assert (m.pointer, m.line) == ("/ssh/identities/0/private_key", 4)
    assert "the reconciler's own SSH key" in m.message
    with pytest.raises(SecretError, match="reconciler's own SSH key"):
        host.read("alice", key_path(host))


def test_any_absolute_path_or_home_folder_is_refused(host):
    for ref in ("/etc/shadow", "~/.ssh/id_rsa", "~root/.ssh/id_rsa"):
        res, errs = errors(spec_text(ref), host)
        assert not res.ok and errs[0].pointer == "/ssh/identities/0/private_key", ref
        assert "reconciler's host" in errs[0].message
        with pytest.raises(SecretError):
            host.read("alice", ref)


def test_a_relative_path_resolves_in_the_owners_folder_never_the_working_dir(host):
    # `ssh/id_ecdsa` is the key relative to the reconciler's working directory (the fixture's
    # cwd): it now names alice's folder, where there is no such file.
    assert Path("ssh/id_ecdsa").read_bytes() == KEY_BYTES
    res, errs = errors(spec_text("ssh/id_ecdsa"), host)
    assert res.ok and not errs  # a name, not a path: allowed, and only warned as missing here
    assert any("is not in alice's secrets folder" in w.message for w in res.warnings)
    with pytest.raises(SecretError, match="cannot read"):
        host.read("alice", "ssh/id_ecdsa")


def test_dot_dot_is_refused(host):
    for ref in ("../../data/ssh/id_ecdsa", "secret://../bob/id_bob", "x/../../bob/id_bob"):
        res, errs = errors(spec_text(ref), host)
        assert not res.ok and "`..`" in errs[0].message, ref
        with pytest.raises(SecretError, match=r"\.\."):
            host.read("alice", ref)


def test_a_symlink_out_of_the_owners_folder_is_refused(host, tmp_path):
    alice = tmp_path / "secrets" / "alice"
    os.symlink(key_path(host), alice / "innocent")
    os.symlink(tmp_path / "secrets" / "bob" / "id_bob", alice / "bobs")
    os.symlink(tmp_path / "data" / "ssh", alice / "dir")
    for ref in ("innocent", "secret://bobs", "dir/id_ecdsa"):
        res, errs = errors(spec_text(ref), host)
        assert not res.ok, ref
        assert errs[0].pointer == "/ssh/identities/0/private_key" and "outside alice's secrets folder" in errs[0].message
        with pytest.raises(SecretError, match="outside alice's secrets folder"):
            host.read("alice", ref)


def test_a_copy_of_the_reconcilers_key_in_the_folder_is_refused_when_read(host, tmp_path):
    (tmp_path / "secrets" / "alice" / "copy").write_bytes(KEY_BYTES)
    with pytest.raises(SecretError, match="copy of the reconciler's own SSH key"):
        host.read("alice", "secret://copy")


def test_another_owners_secret_is_out_of_reach(host):
    with pytest.raises(SecretError):
        host.read("alice", "secret://id_bob")
    assert host.read("bob", "secret://id_bob") == b"BOB KEY\n"


def test_the_owners_own_secret_is_read(host):
    assert host.read("alice", "secret://id_deploy") == b"ALICE DEPLOY KEY\n"
    assert host.read("alice", "id_deploy") == b"ALICE DEPLOY KEY\n"
    res, errs = errors(spec_text("secret://id_deploy"), host)
    assert res.ok and not errs and not res.warnings
    assert res.spec["ssh"]["identities"][0]["private_key"] == "secret://id_deploy"


def test_a_reference_cannot_build_a_path_past_the_check(host):
    # interpolation runs first, then the check sees the path the reference built
    text = spec_text("${job.notes}", extra="job: {notes: " + key_path(host) + "}\n")
    res, errs = errors(text, host)
    assert not res.ok and "the reconciler's own SSH key" in errs[0].message


def test_every_file_field_is_checked(host):
    text = ("tpu: {accelerator: v4-8, zone: us-central2-b}\ncommand: {cmd: 'true'}\n"
            "conda: {name: e, config_file: /etc/passwd}\n")
    res, errs = errors(text, host)
    assert [m.pointer for m in errs] == ["/conda/config_file"]
    text = ("tpu: {accelerator: v4-8, zone: us-central2-b}\ncommand: {cmd: 'true'}\n"
            "venv: {name: e, requirements_file: ../bob/req.txt}\n")
    res, errs = errors(text, host)
    assert [m.pointer for m in errs] == ["/venv/requirements_file"]


def test_without_a_secrets_folder_the_text_is_still_checked():
    res = validate_text(spec_text("/root/.ssh/id_rsa"), "jobs/alice/x.yaml", load_repo_config())
    assert not res.ok and res.errors[0].pointer == "/ssh/identities/0/private_key"
    res = validate_text(spec_text("secret://id_deploy"), "jobs/alice/x.yaml", load_repo_config())
    assert res.ok and not res.warnings


@pytest.mark.parametrize("ref", ["secret://", "secret://a b", "gs://bucket/key", "http://x/y", "a\tb", "C:\\keys\\id", ".", "a//b"])
def test_odd_references_are_refused(ref):
    assert reference_problem(ref) is not None
