"""A process that claims a lease through a LeaseKeeper and keeps it until killed
(test_pg_leases kills it with SIGKILL). argv: ledger URL, lease name, holder, ttl."""

from __future__ import annotations

import sys
import time

from ledger.store import open_leases
from ledger.store.leases import LeaseKeeper


def main() -> None:
    url, name, holder, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    keeper = LeaseKeeper(lambda: open_leases(url), holder, ttl)
    if not keeper.claim(name):
        print("refused", flush=True)
        return
    print("held", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
