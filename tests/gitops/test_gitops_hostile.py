"""A hostile lab member's commits against the real watcher (real hub, clone, `git push`, SQLite).

Every case asserts the exact event the hostile commit becomes, and that the good job pushed
right after it is still submitted: nothing in a repository stops the watcher.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from gitops_helpers import BOB, Hub, git, run_cli, spec, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.fanout.notify_plan import plan as notify_plan
from ledger.gitops import ingest
from ledger.gitops.ingest import spec_validator
from ledger.gitops.watch import Watcher
from ledger.spec.interpolate import MAX_VALUE_CHARS
from ledger.spec.names import job_id_from_path
from ledger.spec.normalize import MAX_SPEC_BYTES
from ledger.spec.policy import parse_policy
from ledger.store.sqlite import SQLiteStore

GOOD = "jobs/alice/good.yaml"


def put(hub: Hub, files: dict[str, str | None]) -> None:
    """Write (or delete) files as they are named, then `git add -A`: a name is never taken
    for a pathspec (`*`, `?`, `[` would be globs to `git add <name>`)."""
    for rel, text in files.items():
        path = hub.work / rel
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    git(hub.work, "add", "-A")


def push_hostile_then_good(hub: Hub, files: dict[str, str], good: str = GOOD) -> tuple[str, str]:
    """Commit the hostile files, then a good job, push both; return the two shas."""
    put(hub, files)
    bad = hub.commit({}, "hostile", approvers=(BOB,))
    put(hub, {good: spec()})
    ok = hub.commit({}, "good job", approvers=(BOB,))
    hub.push()
    return bad, ok


def rejected_for(store, sha: str) -> list:
    return [e for e in store.read_all() if e.type == "rejected" and e.data.get("commit") == sha]


def assert_good_submitted(store, sha: str, job: str = "alice/good") -> None:
    [ev] = [e for e in store.read_stream(job) if e.data.get("commit") == sha]
    assert ev.type == "submitted", ev


# A name that cannot name a stream (control characters) is filed on the branch's stream; a
# printable one under the job id it spells, where its author looks.
@pytest.mark.parametrize(("name", "stream", "needle"), [
    ("new\nline", "_git:main", "has control characters (\\n)"),
    ("tab\there", "_git:main", "has control characters (\\t)"),
    ("carriage\rreturn", "_git:main", "has control characters (\\r)"),
    ("esc\x1b[31m", "_git:main", "has control characters (\\x1b)"),
    ("$(touch PWNED)", "alice/$(touch PWNED)", "has shell metacharacters ($, (, ))"),
    ("a;reboot", "alice/a;reboot", "has shell metacharacters (;)"),
    ("`id`", "alice/`id`", "has shell metacharacters (`)"),
    ("x|y&z", "alice/x|y&z", "has shell metacharacters (&, |)"),
    ("Upper", "alice/Upper", "has uppercase letters"),
])
def test_a_name_that_cannot_be_a_job_is_rejected_for_what_it_holds(hub, store, name, stream, needle):
    hub.bootstrap()
    bad, ok = push_hostile_then_good(hub, {f"jobs/alice/{name}.yaml": spec()})
    report = ingest(hub.bare, store, "main")
    assert report.position == ok
    [ev] = rejected_for(store, bad)
    assert ev.stream == stream and ev.data["reason"] == "invalid spec"
    assert ev.data["path"] == f"jobs/alice/{name}.yaml"
    [err] = ev.data["errors"]
    assert needle in err["message"] and (needle == "has uppercase letters" or "uppercase" not in err["message"])
    assert not Path("PWNED").exists()
    assert_good_submitted(store, ok)


def test_a_name_that_is_not_utf8_is_rejected_and_recorded_printably(hub, store):
    hub.bootstrap()
    bad, ok = push_hostile_then_good(hub, {os.fsdecode(b"jobs/alice/caf\xe9.yaml"): spec()})  # Latin-1, not UTF-8
    ingest(hub.bare, store, "main")
    [ev] = rejected_for(store, bad)
    assert ev.stream == "_git:main"
    assert ev.data["path"] == "jobs/alice/caf\\xe9.yaml"
    assert ev.data["errors"][0]["message"] == "the name 'caf\\xe9' is not valid UTF-8"
    assert_good_submitted(store, ok)


def refs(i: int, n: int) -> str:
    """`n` references to env value E<i>."""
    return ("${command.env.E" + str(i) + "}") * n


BOMB = (
    "tpu: {accelerator: v4-8, zone: us-central2-b}\n"
    "command:\n  cmd: echo $E7\n  env:\n    E0: \"0123456789\"\n"
    + "".join(f"    E{i}: \"{refs(i - 1, 10)}\"\n" for i in range(1, 8))
)


def test_an_interpolation_bomb_is_rejected_naming_the_field(hub, store):
    hub.bootstrap()
    bad, ok = push_hostile_then_good(hub, {"jobs/alice/bomb.yaml": BOMB})
    ingest(hub.bare, store, "main")
    [ev] = rejected_for(store, bad)
    assert ev.stream == "alice/bomb"
    [err] = ev.data["errors"]
    assert err["pointer"] == "/command/env/E4" and err["line"] == 9
    assert f"expands to more than {MAX_VALUE_CHARS:,} characters" in err["message"]
    assert len(str(ev.data)) < 10_000  # the refusal is small; nothing of the bomb is stored
    assert_good_submitted(store, ok)


def test_a_spec_naming_the_reconcilers_key_is_rejected(hub, store, tmp_path, monkeypatch):
    key = tmp_path / "reconciler" / "id_ecdsa"
    monkeypatch.setenv("LEDGER_SSH_KEY", str(key))
    hub.bootstrap()
    steal = spec().replace("command:\n", f"ssh:\n  identities:\n    - private_key: {key}\nsetup: {{modules: [ssh, command]}}\ncommand:\n")
    bad, ok = push_hostile_then_good(hub, {"jobs/alice/steal.yaml": steal})
    ingest(hub.bare, store, "main")
    [ev] = rejected_for(store, bad)
    [err] = ev.data["errors"]
    assert err["pointer"] == "/ssh/identities/0/private_key" and err["line"] == 6
    assert "the reconciler's own SSH key" in err["message"]
    assert_good_submitted(store, ok)


def poisoned(exc: Exception):
    """The real validator, except that poison.yaml raises `exc`: it stands for any failure
    nobody foresaw that a commit's content causes."""
    base = spec_validator()

    def validate(text, path, state):
        if path.endswith("poison.yaml"):
            raise exc
        return base(text, path, state)

    return validate


def test_a_commit_that_cannot_be_ingested_is_quarantined_once_and_alerted(hub, store):
    hub.bootstrap()
    bad, ok = push_hostile_then_good(hub, {"jobs/alice/poison.yaml": spec()})
    validator = poisoned(ValueError("cannot digest this"))
    report = ingest(hub.bare, store, "main", validator=validator)
    assert report.position == ok and report.counts.get("quarantined") == 1
    [q] = [e for e in store.read_all() if e.type == "quarantined"]
    assert q.stream == "_git:main" and q.data == {"commit": bad, "error": "ValueError: cannot digest this", "kind": "ValueError"}
    assert_good_submitted(store, ok)
    assert store.read_stream("alice/poison") == []
    # never retried: the position is past it; another run appends nothing
    head = store.head()
    assert ingest(hub.bare, store, "main", validator=validator).commits == 0 and store.head() == head
    # one alert: the default policy announces `quarantined` to the webhook
    [delivery] = notify_plan(q, parse_policy(None).policy.notify, webhook="http://hooks.example/x", email=False)
    assert "quarantined" in delivery.subject and "cannot digest this" in delivery.text


def test_a_bad_commit_inside_a_backlog_is_isolated(hub, store):
    hub.bootstrap()
    hub.commit({"jobs/alice/a.yaml": spec()}, "a", approvers=(BOB,))
    bad = hub.commit({"jobs/alice/poison.yaml": spec()}, "poison", approvers=(BOB,))
    ok = hub.commit({GOOD: spec()}, "good", approvers=(BOB,))
    hub.push()
    report = ingest(hub.bare, store, "main", validator=poisoned(TypeError("boom")))
    assert report.position == ok and report.counts.get("quarantined") == 1
    assert [e.data["commit"] for e in store.read_all() if e.type == "quarantined"] == [bad]
    assert [e.type for e in store.read_stream("alice/a")] == ["submitted"]
    assert_good_submitted(store, ok)


def test_ledger_watch_once_exits_0_after_hostile_names(hub, store_url):
    hub.bootstrap()
    push_hostile_then_good(hub, {"jobs/alice/new\nline.yaml": spec(), "jobs/alice/$(x).yaml": spec()})
    proc = run_cli(store_url, "watch", "--repo", str(hub.bare), "--once", check=False)
    assert proc.returncode == 0, proc.stderr
    assert "2 rejected" in proc.stdout and "1 submitted" in proc.stdout


def test_a_failing_ingest_backs_off_instead_of_hot_looping(hub, store):
    hub.bootstrap()
    errors: list[Exception] = []
    watcher = Watcher(str(hub.bare), store, "no-such-branch", interval=0.02, use_watchdog=False,
                      on_error=errors.append)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        threading.Event().wait(1.5)
    finally:
        watcher.stop()
        thread.join(timeout=30)
    # 1.5 s at a 0.02 s interval is 75 tries without backoff; doubling allows about 7, and
    # an error is reported when it first happens and at each doubling of the count.
    assert 1 <= len(errors) <= 4, len(errors)
    assert "no-such-branch" in str(errors[0])
    assert watcher.backoff >= 0.02 * 2**4


# -- fuzzing through the real watcher -------------------------------------------------------
NAME_CHARS = st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",))


@pytest.fixture(scope="module")
def fuzz_hub(tmp_path_factory) -> Hub:
    hub = Hub(tmp_path_factory.mktemp("fuzz"))
    hub.bootstrap()
    return hub


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(NAME_CHARS, min_size=1, max_size=40).filter(lambda n: n not in (".", "..") and len(n.encode()) < 200))
def test_fuzzed_file_names_each_become_one_exact_event(fuzz_hub, tmp_path_factory, name):
    hub = fuzz_hub
    db = tmp_path_factory.mktemp("db") / "ledger.db"
    store = SQLiteStore(str(db))
    try:
        path = f"jobs/alice/{name}.yaml"
        good = f"jobs/alice/good-{abs(hash(name)) % 10**9}.yaml"
        bad, ok = push_hostile_then_good(hub, {path: spec()}, good=good)
        ingest(hub.bare, store, "main")
        events = [e for e in store.read_all() if e.data.get("commit") == bad and e.type != "note"]
        job_id, problem, _ = job_id_from_path(path)
        [ev] = events
        if job_id is not None:
            assert (ev.type, ev.stream) == ("submitted", job_id)
        else:
            assert ev.type == "rejected" and ev.data["errors"][0]["message"] == problem
            assert ev.stream == (f"alice/{name}" if name.isprintable() else "_git:main")
        assert ev.data["path"] == path
        assert_good_submitted(store, ok, good[len("jobs/"):-len(".yaml")])
        put(hub, {path: None, good: None})
        hub.commit({}, "clean up", approvers=(BOB,))
        hub.push()
    finally:
        store.close()


REF = st.integers(min_value=0, max_value=6)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fanout=st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=9),
       seed=st.text(st.sampled_from("ab$ {}"), min_size=1, max_size=30))
def test_fuzzed_interpolation_is_bounded_through_the_watcher(fuzz_hub, tmp_path_factory, fanout, seed):
    """Chains of env values referencing the previous one `fanout[i]` times: each spec is
    either submitted within the size limit or rejected naming a /command/env field."""
    hub = fuzz_hub
    store = SQLiteStore(str(tmp_path_factory.mktemp("db") / "ledger.db"))
    try:
        env = [f"    E0: {seed!r}\n"]
        for i, n in enumerate(fanout, start=1):
            env.append(f"    E{i}: \"{refs(i - 1, n)}\"\n")
        text = "tpu: {accelerator: v4-8, zone: us-central2-b}\ncommand:\n  cmd: 'true'\n  env:\n" + "".join(env)
        path = "jobs/alice/fuzz-bomb.yaml"
        bad, ok = push_hostile_then_good(hub, {path: text}, good="jobs/alice/after-bomb.yaml")
        ingest(hub.bare, store, "main")
        [ev] = [e for e in store.read_all() if e.data.get("commit") == bad and e.type != "note"]
        if ev.type == "rejected":
            assert all(err["pointer"].startswith("/command/env/") for err in ev.data["errors"]), ev.data
        else:
            assert ev.type == "submitted" and len(str(ev.data["spec"])) <= 2 * MAX_SPEC_BYTES
        assert_good_submitted(store, ok, "alice/after-bomb")
        put(hub, {path: None, "jobs/alice/after-bomb.yaml": None})
        hub.commit({}, "clean up", approvers=(BOB,))
        hub.push()
    finally:
        store.close()



def test_a_running_watcher_keeps_ingesting_after_hostile_commits(hub, store):
    hub.bootstrap()
    watcher = Watcher(str(hub.bare), store, "main", interval=0.05, use_watchdog=False)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        bad, ok = push_hostile_then_good(hub, {"jobs/alice/new\nline.yaml": spec(), "jobs/alice/bomb.yaml": BOMB})
        wait_for(lambda: [e for e in store.read_stream("alice/good") if e.data.get("commit") == ok], timeout=60)
    finally:
        watcher.stop()
        thread.join(timeout=30)
    assert sorted(e.stream for e in rejected_for(store, bad)) == ["_git:main", "alice/bomb"]
    assert_good_submitted(store, ok)


def test_ledger_plan_shows_hostile_names_escaped(hub, store_url):
    hub.bootstrap()
    git(hub.work, "checkout", "-q", "-b", "pr")
    put(hub, {"jobs/alice/new\nline.yaml": spec(), os.fsdecode(b"jobs/alice/caf\xe9.yaml"): spec(), GOOD: spec()})
    hub.commit({}, "hostile pull request")
    proc = run_cli(store_url, "plan", "pr", "--repo", str(hub.work), "--branch", "main", "--format", "markdown", check=False)
    assert proc.returncode == 1, proc.stderr  # invalid specs fail the check: data, not usage (2)
    assert "| invalid | `alice/new\\nline` |" in proc.stdout and "| invalid | `alice/caf\\xe9` |" in proc.stdout
    assert "| submit | `alice/good` |" in proc.stdout
