"""Webhook figures: a merged pull request's delivery -> `submitted`, and API calls per PR.

    python bench/webhook_bench.py [--merges 20] [--json]

Targets (issue 31): delivery -> submitted p50 <= 300 ms; at most one GitHub API call per
pull request. Real pieces: a bare repository as GitHub's, mirrored by `ledger watch` over
file://, the webhook receiver over HTTP with a signed delivery, the GitHub API double
(tests/gitops/github_double.py) answering through githubkit, SQLite.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gitops"))

from github_double import GitHubDouble, Pull  # noqa: E402

from ledger.app.webhook import WebhookServer  # noqa: E402
from ledger.forge.github import GitHubForge  # noqa: E402
from ledger.gitops.watch import Watcher  # noqa: E402
from ledger.store.sqlite import SQLiteStore  # noqa: E402

SECRET = b"bench-secret"
POLICY = "approval:\n  mode: merge-commit\n  required: 1\n  approvers: codeowners\n  reviews: required\n"
SPEC = "tpu:\n  accelerator: v4-8\n  zone: us-central2-b\ncommand:\n  run: python train.py --seed {i}\n"


def git(cwd: Path, *args: str, who: tuple[str, str] = ("Alice Ng", "alice@lab.org")) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME=who[0], GIT_AUTHOR_EMAIL=who[1], GIT_COMMITTER_NAME=who[0],
               GIT_COMMITTER_EMAIL=who[1], GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, env=env, text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--merges", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bare, work = root / "github.git", root / "work"
        git(root, "init", "-q", "--bare", "-b", "main", str(bare))
        git(root, "clone", "-q", str(bare), str(work))
        git(work, "checkout", "-q", "-b", "main")
        (work / ".ledger").mkdir()
        (work / ".ledger/policy.yaml").write_text(POLICY)
        (work / "CODEOWNERS").write_text("/jobs/ @sam\n/.ledger/ @ada\n")
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", "Set up")
        git(work, "push", "-q", "-u", "origin", "main")
        api = GitHubDouble().start()
        store = SQLiteStore(str(root / "ledger.db"))
        forge = GitHubForge("lab/jobs", "bench-token", base_url=api.url)
        watcher = Watcher(f"file://{bare}", store, "main", interval=60, cache_dir=root / "mirrors",
                          use_watchdog=False, reviews=forge.reviews)
        receiver = WebhookServer("127.0.0.1", 0, secret=SECRET, branch="main",
                                 on_ingest=lambda a: (a.merged and forge.note_merged(*a.merged), watcher.wake()))
        receiver.start()
        thread = threading.Thread(target=watcher.run, daemon=True)
        thread.start()
        time.sleep(1.0)  # the first poll (setup commit) is done; later ones are a minute away
        latencies: list[float] = []
        for i in range(args.merges):
            git(work, "checkout", "-q", "-b", f"pr{i}")
            (work / "jobs/alice").mkdir(parents=True, exist_ok=True)
            (work / f"jobs/alice/j{i}.yaml").write_text(SPEC.format(i=i))
            (work / f"jobs/alice/k{i}.yaml").write_text(SPEC.format(i=i + 1000))
            git(work, "add", "-A")
            git(work, "commit", "-q", "-m", f"PR {i}")
            head = git(work, "rev-parse", "HEAD").strip()
            git(work, "checkout", "-q", "main")
            git(work, "merge", "-q", "--no-ff", f"pr{i}", "-m", f"Merge pull request #{i + 1} from alice/pr{i}",
                who=("Sam Steward", "sam@lab.org"))
            git(work, "push", "-q", "origin", "main")
            api.pulls[i + 1] = Pull(i + 1, head)
            api.review(i + 1, "sam", "APPROVED", head)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            body = json.dumps({"action": "closed", "number": i + 1, "pull_request": {
                "merged": True, "updated_at": stamp, "base": {"ref": "main"}, "head": {"sha": head}}}).encode()
            headers = {"X-Hub-Signature-256": "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest(),
                       "X-GitHub-Delivery": f"bench-{i}", "X-GitHub-Event": "pull_request"}
            started = time.perf_counter()
            req = urllib.request.Request(f"http://127.0.0.1:{receiver.port}/", data=body, headers=headers, method="POST")
            urllib.request.urlopen(req, timeout=10).close()
            while not store.read_stream(f"alice/j{i}"):
                if time.perf_counter() - started > 10:
                    raise SystemExit(f"merge {i} not submitted within 10 s")
                time.sleep(0.002)
            latencies.append((time.perf_counter() - started) * 1000)
            assert store.read_stream(f"alice/j{i}")[0].type == "submitted"
        watcher.stop()
        thread.join(timeout=10)
        receiver.stop()
        api.stop()
        store.close()
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 2 else latencies
    result = {"merges": len(latencies), "delivery_to_submitted_ms_p50": round(statistics.median(latencies), 1),
              "delivery_to_submitted_ms_p90": round(q[89] if len(q) > 89 else max(latencies), 1),
              "api_calls_per_pr": round(api.requests["reviews"] / len(latencies) + api.requests["pull"] / len(latencies), 2),
              "load_average_1m": round(os.getloadavg()[0], 2)}
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
