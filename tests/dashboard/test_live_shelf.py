"""The dashboard keeps a lab's settled jobs packed (ledger.shelf), each with the card its
jobs page lists it by: its pages say what they said with every job held as a state, and an
event for a settled job brings it back. Real SQLite, no server."""

from __future__ import annotations

from pathlib import Path

from ledger.app.dashboard import views
from ledger.app.dashboard.live import LiveLedger
from ledger.app.readmodels import card_of, job_json
from ledger.events import NewEvent
from ledger.replay import load_state
from ledger.store.sqlite import SQLiteStore
from tests.reconciler.test_live import at
from tests.reconciler.test_live import events as live_events


def test_settled_jobs_are_shelved_listed_as_before_and_brought_back(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    store = SQLiteStore(path)
    for job_id, type_, data, ago in live_events():
        store.append(job_id, [NewEvent(type_, data, time=at(ago))])
    full = load_state(store, use_snapshot=False).jobs
    live = LiveLedger(f"sqlite:///{path}")
    try:
        assert sorted(live.jobs.shelf.ids()) == ["bo/just", "bo/old", "cy/cancelled"]
        assert not set(live.jobs.shelf.ids()) & set(live.state.jobs) and live.job_count() == len(full)
        assert live.listing().cards == [card_of(full[i]) for i in sorted(full)]
        page = views.jobs_page(live, views.JobQuery.parse({"per_page": "500"}))
        assert page["jobs"] == [job_json(full[i]) for i in sorted(full)] and page["all"] == len(full)
        assert page["states"] == sorted({(s, sum(j.state == s for j in full.values())) for s in {j.state for j in full.values()}})
        assert views.job_state(live, "bo/old") == job_json(full["bo/old"])

        after = live.position
        store.append("bo/old", [NewEvent("rerun", {"rule": "manual", "attempt": 2, "restarts": 0}, time=at(5))])
        live.fold(list(store.fold_rows(after)))
        again = load_state(store, use_snapshot=False).jobs["bo/old"]
        assert "bo/old" in live.state.jobs and "bo/old" not in live.jobs.shelf and "bo/old" not in live.jobs.shelf.cards
        assert views.job_state(live, "bo/old") == job_json(again) and again.state != full["bo/old"].state
        # The jobs page's listing is made once per position: a visit after the event lists the
        # job as it is now, with the states' counts of now.
        page = views.jobs_page(live, views.JobQuery.parse({"per_page": "500", "q": "bo/old"}))
        assert [r["state"] for r in page["rows"]] == [again.state]
        now = load_state(store, use_snapshot=False).jobs
        assert page["states"] == sorted({(s, sum(j.state == s for j in now.values())) for s in {j.state for j in now.values()}})

        # It ends again and settles back onto the shelf: the shelf's kept listing is made anew.
        after = live.position
        store.append("bo/old", [NewEvent("cancel_requested", {}, time=at(4)), NewEvent("cancelled", {}, time=at(3))])
        live.fold(list(store.fold_rows(after)))
        now = load_state(store, use_snapshot=False).jobs
        assert "bo/old" in live.jobs.shelf and now["bo/old"].state == "cancelled"
        page = views.jobs_page(live, views.JobQuery.parse({"per_page": "500"}))
        assert page["jobs"] == [job_json(now[i]) for i in sorted(now)]
        assert page["states"] == sorted({(s, sum(j.state == s for j in now.values())) for s in {j.state for j in now.values()}})
    finally:
        live.close()
        store.close()


def test_a_live_jobs_card_is_made_again_only_when_an_event_moved_it(tmp_path: Path) -> None:
    """The jobs page's listing keeps each live job's card while its last event is the same:
    an event for one live job (its state edited in place by the fold) lists it as it is
    now, and the others' cards are the ones made before."""
    path = tmp_path / "ledger.db"
    store = SQLiteStore(path)
    for job_id, type_, data, ago in live_events():
        store.append(job_id, [NewEvent(type_, data, time=at(ago))])
    live = LiveLedger(f"sqlite:///{path}")
    try:
        before = {c.id: c for c in live.listing().cards}
        assert before["ana/waiting"].state == "pending"
        after = live.position
        store.append("ana/waiting", [NewEvent("queued", {"reason": "waiting for the lab's v4 chips"}, time=at(5))])
        live.fold(list(store.fold_rows(after)))
        now = {c.id: c for c in live.listing().cards}
        fresh = load_state(store, use_snapshot=False).jobs
        assert list(now.values()) == [card_of(fresh[i]) for i in sorted(fresh)]
        assert now["ana/waiting"].state == "queued" and now["ana/waiting"] != before["ana/waiting"]
        assert now["ana/running"] is before["ana/running"] and now["cy/holding"] is before["cy/holding"]
    finally:
        live.close()
        store.close()
