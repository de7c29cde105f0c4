"""The read/verify/export commands against real SQLite files, through the real CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger import fold
from ledger.app.cli import cli
from ledger.app.commands.common import RICH_TABLE_ROWS, print_table, write_columns
from ledger.app.readmodels import job_json
from ledger.events import NewEvent, actor
from ledger.replay import load_lazy, load_state, save_snapshot
from ledger.snapshots.jobs import code_version, encode_state, lines_decoder
from ledger.store.base import Snapshot
from ledger.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parents[2]
GIT = actor("git", "alice@example.com", approvers=["bob@example.com"])
BOT = actor("reconciler", "reconciler")
SUBMIT = {"spec": {"tpu": {"accelerator": "v4-8"}}, "spec_hash": "ab12cd34", "commit": "c0ffee12345", "path": "jobs/alice/a.yaml",
          "author": "alice@example.com", "approvers": ["bob@example.com"]}


@pytest.fixture
def ledger_file(tmp_path) -> Path:
    path = tmp_path / "ledger.db"
    store = SQLiteStore(path)
    store.append("alice/a", [NewEvent("submitted", SUBMIT, GIT, time="2026-01-01T10:00:00.000000Z")])
    store.append("bob/b", [NewEvent("submitted", {**SUBMIT, "path": "jobs/bob/b.yaml"}, GIT, time="2026-01-01T10:30:00.000000Z")])
    store.append("alice/a", [
        NewEvent("provisioning", {"attempt": 1, "tpu": {"name": "tpu-1", "accelerator": "v4-8", "zone": "us-central2-b", "kind": "node"}},
                 BOT, time="2026-01-01T11:00:00.000000Z"),
        NewEvent("provisioned", {"tpu": {"name": "tpu-1"}, "hosts": [{"worker": 0}]}, BOT, time="2026-01-01T11:05:00.000000Z"),
        NewEvent("setup_started", {}, BOT, time="2026-01-01T11:06:00.000000Z"),
        NewEvent("setup_done", {}, BOT, time="2026-01-01T11:07:00.000000Z"),
        NewEvent("started", {"attempt": 1}, BOT, time="2026-01-01T11:08:00.000000Z"),
    ])
    store.close()
    return path


def run(path: Path, *args: str):
    result = CliRunner(env={"COLUMNS": "200"}).invoke(cli, ["--store", f"sqlite:///{path}", *args], catch_exceptions=False)
    return result


def test_replay_json_and_until(ledger_file):
    out = json.loads(run(ledger_file, "replay", "--json").output)
    assert out["position"] == 7
    jobs = {j["id"]: j for j in out["jobs"]}
    assert jobs["alice/a"]["state"] == "running" and jobs["alice/a"]["owner"] == "alice" and jobs["alice/a"]["attempt"] == 1
    assert jobs["bob/b"]["state"] == "pending" and "restarts" in jobs["bob/b"]
    past = json.loads(run(ledger_file, "replay", "--until", "2026-01-01T10:45:00Z", "--json").output)
    assert past["position"] == 2 and {j["state"] for j in past["jobs"]} == {"pending"}
    by_seq = json.loads(run(ledger_file, "replay", "--until", "1", "--no-snapshot", "--json").output)
    assert [j["id"] for j in by_seq["jobs"]] == ["alice/a"]
    table = run(ledger_file, "replay").output
    assert "alice/a" in table and "running" in table


def test_replay_rejects_bad_until(ledger_file):
    result = run(ledger_file, "replay", "--until", "last tuesday")
    assert result.exit_code == 2 and "neither a seq number nor an ISO time" in result.output


def test_inspect_timeline_and_json(ledger_file):
    result = run(ledger_file, "inspect", "alice/a")
    assert result.exit_code == 0
    for expected in ("submitted", "git:alice@example.com", "approved by bob@example.com", "provisioning", "tpu-1", "started"):
        assert expected in result.output
    shown = json.loads(run(ledger_file, "inspect", "alice/a", "--json").output)
    assert shown["job"] == "alice/a" and shown["waiting"] is None  # it holds its TPU
    envelopes = shown["events"]
    assert [e["version"] for e in envelopes] == [1, 2, 3, 4, 5, 6]
    assert set(envelopes[0]) == {"seq", "stream", "version", "type", "time", "actor", "id", "causation", "data", "prev_hash", "hash"}


def test_inspect_unknown_job(ledger_file):
    result = run(ledger_file, "inspect", "carol/nope")
    assert result.exit_code == 1 and "no job 'carol/nope'" in result.output and "ledger list" in result.output


def test_list_json_is_the_same_text_json_writes_from_the_same_states(ledger_file):
    out = run(ledger_file, "list", "--json").output
    store = SQLiteStore(ledger_file)
    try:
        states = [job_json(j) for j in sorted(load_state(store).jobs.values(), key=lambda j: j.id)]
    finally:
        store.close()
    assert out == json.dumps(states, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_list_filters(ledger_file):
    assert [j["id"] for j in json.loads(run(ledger_file, "list", "--json").output)] == ["alice/a", "bob/b"]
    assert [j["id"] for j in json.loads(run(ledger_file, "list", "--owner", "bob", "--json").output)] == ["bob/b"]
    assert [j["id"] for j in json.loads(run(ledger_file, "list", "--state", "running", "--json").output)] == ["alice/a"]
    assert run(ledger_file, "list", "--state", "sleeping").exit_code == 2


def test_list_and_replay_to_a_pipe_write_a_line_a_job(ledger_file):
    """Not a terminal: plain columns, one line a job however narrow the reader (rich would
    fold the cells to 80 columns, across lines that grep then misses)."""
    for args in (("list",), ("replay",)):
        lines = CliRunner(env={"COLUMNS": "20"}).invoke(cli, ["--store", f"sqlite:///{ledger_file}", *args]).output.splitlines()
        assert lines[1].split() == ["id", "owner", "state", "attempt", "restarts", "tpu", "last", "change"]
        assert [line.split()[:3] for line in lines[2:]] == [["alice/a", "alice", "running"], ["bob/b", "bob", "pending"]]
        assert lines[2].index("running") == lines[1].index("state")  # aligned under the header


def test_a_jobs_lines_are_its_states_fields(ledger_file):
    """`ledger list`'s table decodes a few fields of each job (snapshots.jobs.lines_decoder): the
    same values as the whole state has, JobState's defaults for what a piece leaves out."""
    names = ("id", "owner", "state", "attempt", "restarts", "tpu", "times", "last_error")
    store = SQLiteStore(ledger_file)
    try:
        save_snapshot(store, load_state(store, until=3))  # bob/b from the snapshot's pieces, alice/a after it
        lazy = load_lazy(store)
        ids = lazy.select()
        lines, states = lazy.lines(ids, lines_decoder(names)), lazy.jobs(ids)
        assert lazy.lines(["bob/b"], lines_decoder(names))[0].state == "pending"
    finally:
        store.close()
    assert [[getattr(x, n) for n in names] for x in lines] == [[getattr(x, n) for n in names] for x in states]
    assert lines[0].tpu["name"] == "tpu-1" and lines[1].tpu is None and lines[1].times
    with pytest.raises(ValueError, match="specs"):
        lines_decoder(("id", "specs"))


def test_plain_columns_are_aligned_and_carry_no_control_character():
    out = io.StringIO()
    write_columns(out, "two rows", ("id", "why", "last"),
                  [("a/x", "quota\nexhausted", "1"), ("b/長い名前", "\x1b[2Jwiped", "22")])
    lines = out.getvalue().splitlines()
    assert lines == ["two rows",  # 長い名前 is eight cells wide, as a terminal draws it
                     "id" + " " * 10 + "why" + " " * 14 + "last",
                     "a/x" + " " * 9 + "quota exhausted" + " " * 2 + "1",
                     "b/長い名前" + " " * 2 + " [2Jwiped" + " " * 8 + "22"]
    untitled = io.StringIO()
    write_columns(untitled, None, ("n", "x"), [("10", "a"), ("9", "b")], right=(0,))
    assert untitled.getvalue() == " n  x\n10  a\n 9  b\n"
    empty_last = io.StringIO()
    write_columns(empty_last, None, ("tpu", "health"), [("t-1", ""), ("t-22", "fixed")])
    assert empty_last.getvalue() == "tpu   health\nt-1\nt-22  fixed\n"  # no trailing spaces
    wide_right = io.StringIO()
    write_columns(wide_right, None, ("who", "chips"), [("長い", "8"), ("a", "長")], right=(1,))
    assert wide_right.getvalue() == "who   chips\n長い      8\na        長\n"
    with pytest.raises(ValueError, match="2 cells"):
        write_columns(io.StringIO(), None, ("n", "x"), [("1",)])


def test_a_long_table_on_a_terminal_is_plain_columns_too(monkeypatch, capsys):
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich takes the output for a terminal
    print_table("few [/]", ("id", "state"), [("a/x", "running: [RESOURCE_EXHAUSTED] [/]")])
    boxed = capsys.readouterr().out
    assert "┃" in boxed  # rich's boxed table, its words as they are: a bracket is no markup
    assert "few [/]" in boxed and "[RESOURCE_EXHAUSTED] [/]" in boxed
    print_table("many", ("id", "state"), [(f"a/{i}", "running") for i in range(RICH_TABLE_ROWS + 1)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == RICH_TABLE_ROWS + 3 and lines[2] == "a/0    running"


def test_verify_sound_then_hand_edited(ledger_file):
    result = run(ledger_file, "verify")
    assert result.exit_code == 0 and "7 event(s)" in result.output
    assert json.loads(run(ledger_file, "verify", "--json").output)["ok"] is True
    db = sqlite3.connect(ledger_file, isolation_level=None)
    db.executescript(
        "DROP TRIGGER events_no_update; UPDATE events SET data = '{\"attempt\":9}' WHERE seq = 3;"
        "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN SELECT RAISE(ABORT, 'append-only'); END;"
    )
    db.close()
    result = run(ledger_file, "verify")
    assert result.exit_code == 1 and "seq 3" in result.output and "hash mismatch" in result.output
    report = json.loads(run(ledger_file, "verify", "--json").output)
    assert report["ok"] is False and report["problem"]["position"] == 3


def test_a_forged_snapshot_is_refused_by_list_and_named_by_verify(ledger_file):
    store = SQLiteStore(ledger_file)
    real = load_state(store)
    save_snapshot(store, real)
    store.close()
    lie = fold.LedgerState(real.position, dict(real.jobs))
    lie.jobs["bob/b"] = dataclasses.replace(lie.jobs["bob/b"], state="finished")
    db = sqlite3.connect(ledger_file, isolation_level=None)
    # A raw SQL write of the state only (no trigger guards snapshots): its hash no longer matches.
    db.execute("UPDATE snapshots SET state = ? WHERE name = 'ledger'", (encode_state(lie).manifest,))
    states = {j["id"]: j["state"] for j in json.loads(run(ledger_file, "list", "--json").stdout)}
    assert states == {"alice/a": "running", "bob/b": "pending"}
    result = run(ledger_file, "verify")
    assert result.exit_code == 1 and "snapshot 'ledger' at seq 7" in result.stderr and "does not match its hash" in result.stderr
    # Forged with every hash recomputed: only verify's rebuild from the events can tell.
    encoded = encode_state(lie)
    for name, data in [*((f"ledger.{p}", d) for p, d in encoded.parts.items()), ("ledger", encoded.manifest)]:
        forged = Snapshot.seal(name, code_version(), 7, real_hash(ledger_file, 7), data)
        db.execute("UPDATE snapshots SET state = ?, hash = ? WHERE name = ?", (forged.state, forged.hash, name))
    db.close()
    report = json.loads(run(ledger_file, "verify", "--json").stdout)
    assert report["ok"] is False and report["problem"] is None
    assert [s["problem"] for s in report["snapshots"]] == ["job bob/b: state is 'finished' in it, 'pending' from the events",
                                                          None, None]
    rebuilt = run(ledger_file, "verify", "--rebuild-snapshots")
    assert rebuilt.exit_code == 0 and "fresh one saved" in rebuilt.stdout
    assert run(ledger_file, "verify").exit_code == 0
    states = {j["id"]: j["state"] for j in json.loads(run(ledger_file, "list", "--json").stdout)}
    assert states == {"alice/a": "running", "bob/b": "pending"}


def real_hash(path: Path, seq: int) -> str:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT hash FROM events WHERE seq = ?", (seq,)).fetchone()[0]
    finally:
        db.close()


def test_export_import_round_trip(ledger_file, tmp_path):
    dump = tmp_path / "ledger.jsonl"
    assert run(ledger_file, "export", str(dump)).exit_code == 0
    lines = dump.read_text().splitlines()
    assert len(lines) == 7 and json.loads(lines[0])["seq"] == 1
    copy = tmp_path / "copy.db"
    result = run(copy, "import", str(dump))
    assert result.exit_code == 0, result.output
    original = [e.to_dict() for e in SQLiteStore(ledger_file).read_all()]
    assert [e.to_dict() for e in SQLiteStore(copy).read_all()] == original
    assert run(copy, "import", str(dump)).exit_code == 2  # not empty any more


def test_import_refuses_broken_chain_with_line_number(ledger_file, tmp_path):
    dump = tmp_path / "ledger.jsonl"
    run(ledger_file, "export", str(dump))
    lines = dump.read_text().splitlines()
    event = json.loads(lines[3])
    event["data"]["hosts"] = []
    lines[3] = json.dumps(event)
    dump.write_text("\n".join(lines) + "\n")
    target = tmp_path / "target.db"
    result = run(target, "import", str(dump))
    assert result.exit_code == 1 and f"{dump}:4:" in result.output and "nothing was imported" in result.output
    assert SQLiteStore(target).head() == 0
    dump.write_text(lines[0] + "\n{not json\n")
    result = run(tmp_path / "other.db", "import", str(dump))
    assert result.exit_code == 1 and ":2:" in result.output


def _form1_line(prev: dict, data: dict) -> str:
    """An exported line as a ledger written in canonical form 1 (json.dumps, sort_keys) has
    it: a float needing an exponent is spelled `1e-05`, which today's encoder writes
    `0.00001`, so the hash holds only over the text as written."""
    body = {"seq": prev["seq"] + 1, "stream": "bob/b", "version": 2, "type": "queued", "time": "2026-01-01T12:00:00.000000Z",
            "actor": BOT, "id": "0b1f2c3d-0000-4000-8000-000000000001", "causation": None, "data": data,
            "prev_hash": prev["hash"]}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    hash_ = hashlib.sha256((prev["hash"] + text).encode()).hexdigest()
    return text[:-1] + f',"hash":"{hash_}"}}'


def test_import_and_migrate_keep_a_form_1_float_event_as_it_was_hashed(ledger_file, tmp_path):
    dump = tmp_path / "ledger.jsonl"
    run(ledger_file, "export", str(dump))
    lines = dump.read_text().splitlines()
    form1 = _form1_line(json.loads(lines[-1]), {"held": 1e-05, "needs": 1e16, "reason": "quota"})
    assert '"held":1e-05' in form1 and '"needs":1e+16' in form1
    dump.write_text("\n".join([*lines, form1]) + "\n")
    copy = tmp_path / "copy.db"
    result = run(copy, "import", str(dump))
    assert result.exit_code == 0, result.output
    assert run(copy, "verify").exit_code == 0
    [row] = SQLiteStore(copy).raw_rows(7)
    assert row[8] == '{"held":1e-05,"needs":1e+16,"reason":"quota"}'  # stored as written, not re-encoded
    moved = tmp_path / "moved.db"
    result = run(copy, "migrate", "--from", f"sqlite:///{copy}", "--to", f"sqlite:///{moved}")
    assert result.exit_code == 0, result.output
    assert run(moved, "verify").exit_code == 0
    again = tmp_path / "again.jsonl"
    run(moved, "export", str(again))
    assert again.read_text() == dump.read_text()  # byte for byte, through import and migrate


def test_import_refuses_a_tampered_form_1_float_event(ledger_file, tmp_path):
    dump = tmp_path / "ledger.jsonl"
    run(ledger_file, "export", str(dump))
    lines = dump.read_text().splitlines()
    form1 = _form1_line(json.loads(lines[-1]), {"held": 1e-05, "reason": "quota"})
    for tampered in (form1.replace("1e-05", "2e-05"), form1.replace("1e-05", "0.00001")):
        dump.write_text("\n".join([*lines, tampered]) + "\n")
        target = tmp_path / f"target-{len(tampered)}.db"
        result = run(target, "import", str(dump))
        assert result.exit_code == 1 and f"{dump}:8:" in result.output and "nothing was imported" in result.output
        assert SQLiteStore(target).head() == 0


def cli_process(*args: str, store: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ledger", "--store", store, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_bad_stores_get_one_line_errors(tmp_path):
    missing = cli_process("list", store=f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.returncode == 1 and "no ledger at" in missing.stderr and "Traceback" not in missing.stderr
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    bad = cli_process("replay", store=f"sqlite:///{garbage}")
    assert bad.returncode == 1 and "cannot open ledger" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    newer = tmp_path / "newer.db"
    SQLiteStore(newer).close()
    db = sqlite3.connect(newer, isolation_level=None)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'format'")
    db.close()
    result = cli_process("verify", store=f"sqlite:///{newer}")
    assert result.returncode == 1 and "newer than this tpu-ledger" in result.stderr and "Traceback" not in result.stderr
    unknown = cli_process("list", store="mysql://x")
    assert unknown.returncode == 2 and "unknown store URL" in unknown.stderr


def test_verify_shows_progress_on_big_ledgers(tmp_path, monkeypatch):
    import ledger.app.commands.verify as verify_cmd

    path = tmp_path / "big.db"
    store = SQLiteStore(path)
    store.append_many([(f"u/j{i}", [NewEvent("note", {"text": str(k)}) for k in range(10)], None) for i in range(30)])
    store.close()
    monkeypatch.setattr(verify_cmd, "PROGRESS_FROM", 100)
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "verify"])
    assert result.exit_code == 0 and "300 event(s)" in result.output


def test_a_long_replay_shows_how_far_it_got_on_a_terminal_and_nothing_elsewhere(tmp_path, monkeypatch):
    """`ledger replay --until` before the oldest snapshot kept folds every event up to there
    (seconds at a lab's 1M events): it reports each PROGRESS_EVERY events, and the bar is drawn
    on a terminal only; in a pipe or a log standard error stays empty, the table the same."""
    import ledger.replay as replay_module
    from ledger.app.commands.common import ProgressBar

    path = tmp_path / "big.db"
    store = SQLiteStore(path)
    store.append_many([(f"u/j{i}", [NewEvent("note", {"text": str(k)}) for k in range(10)], None) for i in range(30)])
    reports: list[int] = []
    monkeypatch.setattr(replay_module, "PROGRESS_EVERY", 50)
    state = replay_module.load_state(store, until=280, progress=reports.append)
    assert reports == [50, 100, 150, 200, 250] and state == replay_module.load_state(store, until=280)
    store.close()
    args = ["--store", f"sqlite:///{path}", "replay", "--until", "280"]
    shown = CliRunner().invoke(cli, args)
    assert shown.exit_code == 0 and shown.stderr == "" and "ledger at seq 280: 28 job(s)" in shown.stdout

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    with ProgressBar("replaying", 280) as bar:
        bar(200)
    assert "replaying" in screen.getvalue() and "200/280" in screen.getvalue()


def test_foreign_sqlite_file_is_refused_not_written(tmp_path):
    foreign = tmp_path / "app.db"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE users (name TEXT)")
    db.commit()
    db.close()
    result = cli_process("list", store=f"sqlite:///{foreign}")
    assert result.returncode == 1 and "not a tpu-ledger ledger" in result.stderr
    tables = {r[0] for r in sqlite3.connect(foreign).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"users"}


def test_store_url_options(tmp_path):
    from ledger.errors import UsageError
    from ledger.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'n.db'}?synchronous=normal")
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    store.close()
    with pytest.raises(UsageError):
        open_store(f"sqlite:///{tmp_path / 'n.db'}?fsync=never")


def test_list_json_from_a_snapshots_pieces_and_its_tail_is_the_text_of_a_full_replay(ledger_file):
    """`ledger list --json` writes the snapshot's own text of each job it did not fold, and
    folds the tail's jobs: byte for byte what printing a full replay's states gives."""
    from ledger import jsontext
    from ledger.app.readmodels import card_of, job_json, select_jobs

    store = SQLiteStore(ledger_file)
    save_snapshot(store, load_state(store, until=3))  # alice/a provisioning: the rest is its tail
    store.append("carol/c", [NewEvent("submitted", {**SUBMIT, "path": "jobs/carol/c.yaml"}, GIT, time="2026-01-01T12:00:00.000000Z")])
    store.append("bob/b", [NewEvent("cancel_requested", {}, GIT, time="2026-01-01T12:01:00.000000Z")])
    full = load_state(store, use_snapshot=False)
    assert {(s.name, s.position) for s in store.list_snapshots()} == {("ledger", 3), ("ledger.pieces", 3), ("ledger.rows", 3)}
    store.close()
    assert full.position > 3
    for args, owner in ((), None), (("--owner", "alice"), "alice"), (("--owner", "nobody"), "nobody"):
        chosen = select_jobs(map(card_of, full.jobs.values()), owner=owner)
        expected = jsontext.pretty([job_json(full.jobs[c.id]) for c in chosen]).decode() + "\n"
        assert run(ledger_file, "list", *args, "--json").output == expected
    assert [j["id"] for j in json.loads(run(ledger_file, "list", "--json").output)] == ["alice/a", "bob/b", "carol/c"]
    assert run(ledger_file, "list", "--owner", "nobody", "--json").output == "[]\n"
    assert [j["id"] for j in json.loads(run(ledger_file, "list", "--state", "running", "--json").output)] == ["alice/a"]
