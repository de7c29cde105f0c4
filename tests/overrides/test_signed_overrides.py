"""Admin overrides signed with `ssh-keygen -Y sign` (real OpenSSH), checked against the
allowed-signers file before they are recorded; refused unsigned when the policy says so."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.app.cli import cli
from ledger.events import NewEvent, actor
from ledger.events.data import OverrideSignature
from ledger.overrides import NAMESPACE, Statement, problem
from ledger.spec.policy import parse_policy, sharing_blocks
from ledger.store import open_store
from ledger.usage import POLICY_STREAM

SPEC = {"tpu": {"accelerator": "v4-8", "zone": "us-central2-b", "pricing": "spot"}, "command": {"cmd": "true"}}
GIT = {"spec_hash": "ab" * 32, "commit": "c0ffee", "path": "jobs/alice/bert.yaml"}


def keypair(folder: Path, name: str) -> tuple[Path, str]:
    key = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)
    return key, " ".join(Path(f"{key}.pub").read_text().split()[:2])


@pytest.fixture
def lab(tmp_path: Path):
    """A ledger with one running-ish job, and an allowed-signers file trusting the steward's
    key for overrides and the intern's for git commits only."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    store = open_store(url)
    store.append("alice/bert", [NewEvent("submitted", {**GIT, "spec": SPEC}, actor("git", "alice"))])
    store.close()
    steward, steward_pub = keypair(tmp_path, "steward")
    intern, intern_pub = keypair(tmp_path, "intern")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f'sam@lab.org namespaces="git,{NAMESPACE}" {steward_pub}\n'
                       f'ivy@lab.org namespaces="git" {intern_pub}\n')
    return url, steward, intern, allowed


def ledger(url: str, *args: str):
    return CliRunner().invoke(cli, ["--store", url, *args])


def last_event(url: str, job: str = "alice/bert"):
    store = open_store(url, create=False)
    try:
        return store.read_stream(job)[-1]
    finally:
        store.close()


def test_a_signed_cancel_records_the_verified_signer_and_a_signature_openssh_verifies(lab, tmp_path: Path):
    url, steward, _, allowed = lab
    out = ledger(url, "cancel", "alice/bert", "--reason", "burning quota", "--sign-with", str(steward),
                 "--allowed-signers", str(allowed))
    assert out.exit_code == 0, out.output
    assert "by sam@lab.org (signature verified" in out.output
    event = last_event(url)
    assert event.type == "cancel_requested" and event.actor["name"] == "sam@lab.org" and event.actor["signed"] is True
    signed = event.data["signed"]
    statement = Statement.parse(signed["statement"])
    assert (statement.action, statement.job, statement.version, statement.reason) == \
        ("cancel_requested", "alice/bert", 1, "burning quota")
    assert problem(OverrideSignature(**signed), event.type, event.stream, event.version - 1) is None
    # Anyone can check it again without tpu-ledger:
    (tmp_path / "sig").write_text(signed["signature"])
    check = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", "sam@lab.org", "-n", NAMESPACE,
                            "-s", str(tmp_path / "sig")], input=signed["statement"].encode(), capture_output=True)
    assert check.returncode == 0, check.stderr
    assert problem(OverrideSignature(**signed), event.type, event.stream, event.version) is not None  # not replayable


@pytest.mark.parametrize("command", [["admit", "alice/bert", "--reason", "deadline"], ["rerun", "alice/bert"]])
def test_every_override_can_be_signed(lab, command):
    url, steward, _, allowed = lab
    if command[0] == "rerun":
        store = open_store(url)
        store.append("alice/bert", [NewEvent("cancel_requested", {}, actor("git", "alice")),
                                    NewEvent("cancelled", {}, actor("reconciler", "r"))])
        store.close()
    out = ledger(url, *command, "--sign-with", str(steward), "--allowed-signers", str(allowed))
    assert out.exit_code == 0, out.output
    event = last_event(url)
    assert event.actor["name"] == "sam@lab.org" and event.data["signed"]["signer"] == "sam@lab.org"
    if command[0] == "admit":
        assert event.data["by"] == "sam@lab.org"


def test_a_key_not_trusted_for_overrides_records_nothing(lab):
    url, _, intern, allowed = lab
    out = ledger(url, "cancel", "alice/bert", "--reason", "r", "--sign-with", str(intern), "--allowed-signers", str(allowed))
    assert out.exit_code == 1 and "does not let the key" in out.output, out.output
    out = ledger(url, "cancel", "alice/bert", "--reason", "r", "--sign-with", str(intern), "--signer", "ivy@lab.org",
                 "--allowed-signers", str(allowed))
    assert out.exit_code == 1 and "not trusted" in out.output and "allowed only for namespaces git" in out.output
    out = ledger(url, "cancel", "alice/bert", "--reason", "r", "--sign-with", str(intern), "--signer", "sam@lab.org",
                 "--allowed-signers", str(allowed))
    assert out.exit_code == 1 and "not trusted" in out.output  # claiming another's name
    assert last_event(url).type == "submitted"


def test_when_the_policy_requires_signatures_an_unsigned_override_is_refused(lab):
    url, steward, _, allowed = lab
    policy = parse_policy("overrides:\n  signatures: required\n").policy
    store = open_store(url)
    store.append(POLICY_STREAM, [NewEvent("policy_changed", {"commit": "c0ffee", "prices": [],
                                                             "sharing": sharing_blocks(policy)}, actor("watcher", "w"))])
    store.close()
    refused = ledger(url, "cancel", "alice/bert", "--reason", "r")
    assert refused.exit_code == 1 and "requires overrides to be signed" in refused.output
    assert last_event(url).type == "submitted"
    signed = ledger(url, "cancel", "alice/bert", "--reason", "r", "--sign-with", str(steward), "--allowed-signers", str(allowed))
    assert signed.exit_code == 0, signed.output


def test_a_statement_is_canonical_json_and_nothing_else():
    s = Statement("cancel_requested", "a/b", 3, "why", "sam", "2026-11-25T12:00:00Z")
    assert Statement.parse(s.text()) == s
    assert json.loads(s.text())["kind"] == "tpu-ledger override v1"
    with pytest.raises(Exception, match="canonical"):
        Statement.parse(json.dumps(json.loads(s.text()), indent=1))


def test_verify_checks_every_recorded_override_signature_again(lab, tmp_path: Path):
    """A signature that vouches for another event (copied onto a second job) or whose
    statement was changed passes the schema, but `ledger verify` rejects the ledger."""
    url, steward, _, allowed = lab
    assert ledger(url, "cancel", "alice/bert", "--reason", "r", "--sign-with", str(steward),
                  "--allowed-signers", str(allowed)).exit_code == 0
    assert ledger(url, "verify").exit_code == 0
    signed = last_event(url).data["signed"]
    store = open_store(url, create=False)
    try:
        store.append("alice/other", [NewEvent("submitted", {**GIT, "spec": SPEC}, actor("git", "alice"))])
        store.append("alice/other", [NewEvent("cancel_requested", {"reason": "r", "manual": True, "signed": signed},
                                              actor("cli", "sam@lab.org", manual=True, signed=True))],
                     expected_version=1)
    finally:
        store.close()
    out = ledger(url, "verify")
    assert out.exit_code != 0
    assert "override signature: the statement signs cancel_requested of alice/bert" in out.output
