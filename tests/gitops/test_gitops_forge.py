"""GitHub for real, against a local double of its REST API: a merged pull request's approving
reviews on the merged head, with their CODEOWNERS standing, at one API call per pull request;
and the webhook receiver that ingests a merge as soon as it is delivered."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from github_double import GitHubDouble, Pull
from gitops_helpers import ALICE, BOB, CAROL, CODEOWNERS, Hub, git, spec, wait_for

from ledger.app.webhook import WebhookServer
from ledger.forge.github import GitHubForge
from ledger.forge.webhook import Deliveries, github, github_signature_ok, gitlab
from ledger.gitops import ingest
from ledger.gitops.watch import Watcher

POLICY = "approval:\n  mode: merge-commit\n  required: 1\n  approvers: codeowners\n  reviews: {reviews}\n"
SECRET = b"s3cret"


@pytest.fixture
def api():
    double = GitHubDouble().start()
    yield double
    double.stop()


def merge_pr(hub: Hub, number: int, files: dict[str, str], author=ALICE, merger=BOB) -> tuple[str, str]:
    """A pull request merged as GitHub merges it: (merge commit, head commit)."""
    git(hub.work, "checkout", "-q", "-b", f"pr{number}")
    head = hub.commit(files, f"PR {number}", author=author)
    git(hub.work, "checkout", "-q", "main")
    git(hub.work, "merge", "-q", "--no-ff", f"pr{number}", "-m", f"Merge pull request #{number} from x/pr{number}",
        author=merger)
    hub.push()
    return hub.head(), head


def setup(hub: Hub, reviews: str) -> None:
    hub.commit({".ledger/policy.yaml": POLICY.format(reviews=reviews), "CODEOWNERS": CODEOWNERS}, "Set up")
    hub.push("-u")


def test_approving_reviews_on_the_merged_head_are_recorded_with_their_standing(hub, store, api):
    setup(hub, "required")
    merge, head = merge_pr(hub, 7, {"jobs/alice/a.yaml": spec(), "jobs/alice/b.yaml": spec("v4-16")})
    api.pulls[7] = Pull(7, head)
    api.review(7, "bob", "APPROVED", head)   # an owner of jobs/alice/ (@bob in CODEOWNERS)
    api.review(7, "dave", "APPROVED", head)  # approves, owns nothing: recorded, not counted
    forge = GitHubForge("lab/jobs", "tok-123", base_url=api.url)
    ingest(hub.bare, store, "main", reviews=forge.reviews)
    [ev] = store.read_stream("alice/a")
    assert ev.type == "submitted" and ev.data["pr"] == 7
    assert ev.data["reviews"] == [{"login": "bob", "codeowner": True, "commit": head},
                                  {"login": "dave", "codeowner": False, "commit": head}]
    assert ev.data["approvers"] == ["@bob", "@dave"]
    assert store.read_stream("alice/b")[0].type == "submitted"
    assert api.requests == {"reviews": 1}  # two job files, one pull request, one call
    assert api.tokens == ["token tok-123"] and "tok-123" not in repr(forge)


def test_a_review_of_an_earlier_commit_or_a_later_change_request_does_not_count(hub, store, api):
    setup(hub, "required")
    git(hub.work, "checkout", "-q", "-b", "pr8")
    first = hub.commit({"jobs/alice/c.yaml": spec()}, "first")
    head = hub.commit({"jobs/alice/c.yaml": spec("v4-32")}, "then bigger")
    git(hub.work, "checkout", "-q", "main")
    git(hub.work, "merge", "-q", "--no-ff", "pr8", "-m", "Merge pull request #8 from x/pr8", author=BOB)
    hub.push()
    api.pulls[8] = Pull(8, head)
    api.review(8, "bob", "APPROVED", first, at="2026-01-01T00:00:00Z")  # bob owns jobs/alice/, but saw v4-8
    api.review(8, "carol", "APPROVED", head, at="2026-01-01T00:00:01Z")
    api.review(8, "carol", "CHANGES_REQUESTED", head, at="2026-01-01T00:00:02Z")
    ingest(hub.bare, store, "main", reviews=GitHubForge("lab/jobs", base_url=api.url).reviews)
    [ev] = store.read_stream("alice/c")
    assert ev.type == "rejected"
    assert "0 approving review(s) on its merged head" in ev.data["reason"], ev.data["reason"]


def test_reviews_required_without_a_forge_is_a_reason_not_a_guess(hub, store):
    setup(hub, "required")
    merge_pr(hub, 9, {"jobs/alice/d.yaml": spec()})
    ingest(hub.bare, store, "main")
    [ev] = store.read_stream("alice/d")
    assert ev.type == "rejected" and "has no forge to ask" in ev.data["reason"]


def _signed(body: dict, delivery: str, event: str = "pull_request") -> tuple[dict[str, str], bytes]:
    raw = json.dumps(body).encode()
    sig = "sha256=" + hmac.new(SECRET, raw, hashlib.sha256).hexdigest()
    return {"x-hub-signature-256": sig, "x-github-delivery": delivery, "x-github-event": event}, raw


def merged_payload(number: int, head: str, now: float) -> dict:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return {"action": "closed", "number": number,
            "pull_request": {"merged": True, "updated_at": stamp, "base": {"ref": "main"}, "head": {"sha": head}}}


def test_deliveries_are_checked_for_signature_replay_and_age():
    now, seen = 1_800_000_000.0, Deliveries(max_age=300)
    headers, body = _signed(merged_payload(3, "a" * 40, now), "d-1")
    ok = github(headers, body, SECRET, "main", seen, now)
    assert ok.kind == "ingest" and ok.merged == (3, "a" * 40)
    assert github(headers, body, SECRET, "main", seen, now + 1).status == 409  # replayed
    assert github(headers, body, b"other", "main", seen, now).status == 401
    assert github({**headers, "x-hub-signature-256": "sha256=" + "0" * 64}, body, SECRET, "main", seen, now).status == 401
    old_headers, old = _signed(merged_payload(3, "a" * 40, now - 301), "d-2")
    assert github(old_headers, old, SECRET, "main", seen, now).status == 410  # stale
    other_headers, other = _signed({**merged_payload(4, "b" * 40, now), "pull_request": {
        **merged_payload(4, "b" * 40, now)["pull_request"], "base": {"ref": "dev"}}}, "d-3")
    assert github(other_headers, other, SECRET, "main", seen, now).kind == "ignore"
    push_headers, push = _signed({"ref": "refs/heads/main", "repository": {"pushed_at": int(now)}}, "d-4", "push")
    assert github(push_headers, push, SECRET, "main", seen, now).kind == "ingest"
    assert not github_signature_ok(SECRET, body, None)
    lab = json.dumps({"object_kind": "merge_request", "object_attributes": {
        "action": "merge", "target_branch": "main", "iid": 5, "last_commit": {"id": "c" * 40},
        "updated_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))}}).encode()
    ok = gitlab({"x-gitlab-token": "s3cret", "x-gitlab-event-uuid": "u-1"}, lab, SECRET, "main", Deliveries(), now)
    assert ok.kind == "ingest" and ok.merged == (5, "c" * 40)
    assert gitlab({"x-gitlab-token": "nope", "x-gitlab-event-uuid": "u-2"}, lab, SECRET, "main", Deliveries(),
                  now).status == 401


def test_a_delivered_merge_is_ingested_at_once(hub, store, api, tmp_path):
    setup(hub, "required")
    forge = GitHubForge("lab/jobs", base_url=api.url)
    watcher = Watcher(f"file://{hub.bare}", store, "main", interval=60, cache_dir=tmp_path / "mirrors",
                      use_watchdog=False, reviews=forge.reviews)
    receiver = WebhookServer("127.0.0.1", 0, secret=SECRET, branch="main",
                             on_ingest=lambda a: (a.merged and forge.note_merged(*a.merged), watcher.wake()))
    receiver.start()
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: watcher.repo.branch_head("main"))
        time.sleep(0.2)  # the first poll has run; the next one is a minute away
        merge, head = merge_pr(hub, 11, {"jobs/alice/e.yaml": spec()}, author=ALICE, merger=CAROL)
        api.pulls[11] = Pull(11, head)
        api.review(11, "bob", "APPROVED", head)
        headers, body = _signed(merged_payload(11, head, time.time()), "delivery-11")
        req = urllib.request.Request(f"http://127.0.0.1:{receiver.port}/", data=body, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=10) as answer:
            assert answer.status == 202
        ev = wait_for(lambda: next(iter(store.read_stream("alice/e")), None), timeout=10)
        assert ev.type == "submitted" and ev.data["approvers"] == ["@bob"]
        with pytest.raises(urllib.error.HTTPError) as replay:
            urllib.request.urlopen(req, timeout=10)
        assert replay.value.code == 409
    finally:
        watcher.stop()
        thread.join(timeout=10)
        receiver.stop()
