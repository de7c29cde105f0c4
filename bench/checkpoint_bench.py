"""Signed checkpoints: what signing, publishing and checking them costs.

    python bench/checkpoint_bench.py [--checkpoints 1000] [--events 10000] [--json]

Everything is real: the reconciler's ECDSA key (made as `ledger reconcile` makes it), a
SQLite ledger, a bare git hub on this machine, `git fetch` / `git push`. Figures: sign one
checkpoint; verify one signature; publish one checkpoint (fetch the ref, commit, push) to
the hub; and `ledger verify --checkpoints`' own part (read the ref's whole history from the
hub, check every checkpoint's signature and its hash against the ledger) for a ref holding
--checkpoints checkpoints, which is about 17 hours of a reconciler checkpointing every
minute while the ledger moves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ledger.app.commands.checkpoint import verify_checkpoints  # noqa: E402
from ledger.checkpoints import NAMESPACE, AllowedSigners, CheckpointRepo, SigningKey, sign  # noqa: E402
from ledger.checkpoints.sshsig import Signature  # noqa: E402
from ledger.events import NewEvent, actor  # noqa: E402
from ledger.store.sqlite import SQLiteStore  # noqa: E402
from reconciler.keys import ensure_key  # noqa: E402

REF = "refs/ledger/checkpoints"


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="checkpoint-bench-"))
    key_path = root / "id_ecdsa"
    ensure_key(key_path)
    key = SigningKey.load(key_path)
    store = SQLiteStore(root / "ledger.db")
    who = actor("cli", "bench")
    per = max(1, args.events // args.checkpoints)
    hub = root / "hub.git"
    subprocess.run(["git", "init", "-q", "--bare", str(hub)], check=True)

    # A ref with one checkpoint per `per` events, built as publishing builds it (one push).
    repo = CheckpointRepo(str(hub), REF)
    parent = None
    for _ in range(args.checkpoints):
        store.append("_bench", [NewEvent("note", {"text": "x"}, who) for _ in range(per)])
        head = store.head()
        signed = sign(key, seq=head, hash=store.hash_at(head), signer="recon-a", when=datetime.now(UTC))
        parent = repo._commit(signed, parent, f"checkpoint: seq {head}\n")
    repo._scratch().git.push("--quiet", str(hub), f"{parent}:{REF}")
    repo.close()

    head = store.head()
    body = sign(key, seq=head, hash=store.hash_at(head), signer="recon-a", when=datetime.now(UTC))
    sign_s = timed(lambda: sign(key, seq=head, hash=store.hash_at(head), signer="recon-a", when=datetime.now(UTC)), 200)
    signature = Signature.from_armor(body.signature)
    verify_s = timed(lambda: signature.verify(body.body, NAMESPACE), 200)

    publisher = CheckpointRepo(str(hub), REF)
    publish_s = timed(lambda: publisher.publish(body, "checkpoint\n"), 20)
    publisher.close()

    allowed = root / "allowed_signers"
    allowed.write_text(AllowedSigners(()).line_for("recon-a", key.public_key, NAMESPACE) + "\n")
    reports = []

    def check() -> None:
        reports.append(verify_checkpoints(store, sources=(), repo_url=str(hub), ref=REF, allowed_path=allowed))

    check_s = timed(check, 3)
    assert not reports[-1].bad and len(reports[-1].verdicts) == args.checkpoints + 20
    figures = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "sign_ms_median": median_ms(sign_s),
        "verify_signature_ms_median": median_ms(verify_s),
        "publish_to_local_hub_ms_median": median_ms(publish_s),
        "checkpoints": args.checkpoints + 20,
        "ledger_events": head,
        "verify_all_checkpoints_s_median": round(statistics.median(check_s), 3),
        "per_checkpoint_ms": round(statistics.median(check_s) / (args.checkpoints + 20) * 1000, 3),
    }
    store.close()
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for name, value in figures.items():
            print(f"{name:34} {value}")


if __name__ == "__main__":
    main()
